//! What the doctor reports: findings with a severity, the evidence read from the node and
//! the fix, printed for people or as JSON for monitoring.

use std::io::{self, Write};

use serde::Serialize;

use crate::tools::dump::Format;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// A check that passed, so a clean report shows what was looked at.
    Ok,
    /// Worth knowing, nothing to fix now.
    Info,
    /// Will bite under some conditions, or needs a look.
    Warning,
    /// Breaks pods now or on their next ADD; makes the exit status 1.
    Error,
}

impl Severity {
    fn label(self) -> &'static str {
        match self {
            Severity::Ok => "OK",
            Severity::Info => "INFO",
            Severity::Warning => "WARNING",
            Severity::Error => "ERROR",
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// A stable name of the check, for monitoring rules.
    pub check: &'static str,
    pub summary: String,
    pub evidence: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fix: String,
    /// For `primary-need`: the verdict on the network's primary, whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<crate::tools::primaries::Verdict>,
}

impl Finding {
    pub fn new(severity: Severity, check: &'static str, summary: impl Into<String>) -> Finding {
        Finding {
            severity,
            check,
            summary: summary.into(),
            evidence: Vec::new(),
            fix: String::new(),
            verdict: None,
        }
    }

    pub fn verdict(mut self, verdict: crate::tools::primaries::Verdict) -> Finding {
        self.verdict = Some(verdict);
        self
    }

    pub fn evidence(mut self, line: impl Into<String>) -> Finding {
        self.evidence.push(line.into());
        self
    }

    /// Evidence of many lines, capped (`capped`).
    pub fn listing(mut self, lines: Vec<String>) -> Finding {
        self.evidence = capped(lines);
        self
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = fix.into();
        self
    }
}

/// Evidence lists are capped so that a node after a reboot (every record's namespace gone)
/// still gets a readable report.
pub const MAX_EVIDENCE: usize = 20;

pub fn capped(lines: Vec<String>) -> Vec<String> {
    let total = lines.len();
    let mut kept: Vec<String> = lines.into_iter().take(MAX_EVIDENCE).collect();
    if total > MAX_EVIDENCE {
        kept.push(format!("... and {} more", total - MAX_EVIDENCE));
    }
    kept
}

#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn add(&mut self, finding: Finding) {
        self.findings.push(finding);
    }

    pub fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    /// 1 when any finding is an error, so that monitoring can alert on the exit status.
    pub fn exit_status(&self) -> i32 {
        i32::from(self.count(Severity::Error) > 0)
    }

    pub fn write(&mut self, out: &mut impl Write, format: Format) -> io::Result<()> {
        // Worst first; the checks' own order within a severity.
        self.findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
        match format {
            Format::Json => {
                let body = serde_json::json!({
                    "findings": self.findings,
                    "errors": self.count(Severity::Error),
                    "warnings": self.count(Severity::Warning),
                });
                serde_json::to_writer_pretty(&mut *out, &body).map_err(io::Error::from)?;
                writeln!(out)
            }
            Format::Table => {
                for finding in &self.findings {
                    writeln!(
                        out,
                        "{:<8} {:<18} {}",
                        finding.severity.label(),
                        finding.check,
                        finding.summary
                    )?;
                    for line in &finding.evidence {
                        writeln!(out, "{:<28}evidence: {line}", "")?;
                    }
                    if !finding.fix.is_empty() {
                        writeln!(out, "{:<28}fix: {}", "", finding.fix)?;
                    }
                }
                writeln!(
                    out,
                    "\n{} errors, {} warnings, {} notes, {} checks passed",
                    self.count(Severity::Error),
                    self.count(Severity::Warning),
                    self.count(Severity::Info),
                    self.count(Severity::Ok)
                )
            }
        }
    }
}
