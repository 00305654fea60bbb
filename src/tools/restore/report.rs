//! The report of a restore: one row per sandbox, what became of it.

use std::io::{self, Write};

use super::plan::Step;

/// How one sandbox ended.
pub enum Outcome {
    Intact,
    /// Another sandbox owns the pod key: the pod's address belongs there, not here.
    Superseded(String),
    NetnsGone(String),
    NotRestorable(String),
    Planned(Vec<Step>),
    Restored(Vec<Step>),
    Failed {
        done: Vec<Step>,
        error: String,
    },
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Intact => "intact",
            Outcome::Superseded(_) => "superseded",
            Outcome::NetnsGone(_) => "netns-gone",
            Outcome::NotRestorable(_) => "NOT RESTORABLE",
            Outcome::Planned(_) => "would restore",
            Outcome::Restored(_) => "restored",
            Outcome::Failed { .. } => "FAILED",
        }
    }

    pub fn is_problem(&self) -> bool {
        matches!(self, Outcome::NotRestorable(_) | Outcome::Failed { .. })
    }
}

pub struct Row {
    pub container_id: String,
    pub if_name: String,
    pub network: String,
    pub netns: String,
    pub outcome: Outcome,
}

pub fn write_report(out: &mut impl Write, rows: &[Row], dry_run: bool) -> io::Result<()> {
    let mut lines = vec![["CONTAINER", "IF", "NETWORK", "NETNS", "RESULT"].map(String::from)];
    for row in rows {
        lines.push([
            row.container_id.chars().take(13).collect(),
            row.if_name.clone(),
            row.network.clone(),
            row.netns.clone(),
            row.outcome.word().to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    let mut detailed = false;
    for row in rows {
        let (heading, steps, note): (&str, &[Step], Option<&str>) = match &row.outcome {
            Outcome::Intact => continue,
            Outcome::NetnsGone(why) | Outcome::NotRestorable(why) | Outcome::Superseded(why) => {
                ("", &[], Some(why))
            }
            Outcome::Planned(steps) => ("would run:", steps, None),
            Outcome::Restored(steps) => ("ran:", steps, None),
            Outcome::Failed { done, error } => ("ran:", done, Some(error)),
        };
        if !detailed {
            writeln!(out)?;
            detailed = true;
        }
        writeln!(
            out,
            "{} {} ({}): {}",
            row.container_id,
            row.if_name,
            row.network,
            row.outcome.word()
        )?;
        if let Some(note) = note {
            writeln!(out, "  {note}")?;
        }
        if !steps.is_empty() {
            writeln!(out, "  {heading}")?;
            for step in steps {
                writeln!(out, "    {step}")?;
            }
        }
    }
    let count = |word: &str| rows.iter().filter(|r| r.outcome.word() == word).count();
    writeln!(
        out,
        "\n{} sandboxes: {} {}, {} intact (untouched), {} superseded (untouched), {} with their netns gone, {} not restorable, {} failed{}",
        rows.len(),
        count(if dry_run { "would restore" } else { "restored" }),
        if dry_run {
            "would be restored"
        } else {
            "restored"
        },
        count("intact"),
        count("superseded"),
        count("netns-gone"),
        count("NOT RESTORABLE"),
        count("FAILED"),
        if dry_run {
            " (dry run: nothing was changed)"
        } else {
            ""
        },
    )
}
