//! A boot of the test's own: another id bind-mounted over `/proc/sys/kernel/random/boot_id`
//! in a mount namespace of the plugin's own (the kernel's file, read as the plugin reads it).
//! Needs `crate::sys` and `crate::cni`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cni::{Cni, Store, bin};
use crate::sys;

/// A boot id of the test's own, in a file to bind-mount over the kernel's.
pub struct Boot {
    pub id: String,
    file: PathBuf,
    _dir: sys::TempDir,
}

impl Boot {
    pub fn new(n: u8) -> Boot {
        let dir = sys::TempDir::new("sgboot");
        let id = format!("{n:08x}-0000-4000-8000-{:012x}", std::process::id());
        let file = dir.path.join("boot_id");
        std::fs::write(&file, format!("{id}\n")).unwrap();
        Boot {
            id,
            file,
            _dir: dir,
        }
    }

    /// `command`'s program and arguments run under this boot id.
    pub fn wrapper(&self) -> Vec<String> {
        vec![
            "/usr/bin/unshare".into(),
            "-m".into(),
            "/bin/sh".into(),
            "-c".into(),
            format!(
                "/usr/bin/mount --bind {} /proc/sys/kernel/random/boot_id && exec \"$@\"",
                self.file.display()
            ),
            "sh".into(),
        ]
    }

    pub fn cni(&self, cni: Cni) -> Cni {
        let wrapper = self.wrapper();
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        cni.wrapped_in(&wrapper)
    }

    /// The operator's command `args` (the plugin hands them to the ctl beside it).
    pub fn guard(&self, args: &[&str]) -> std::process::Output {
        let wrapper = self.wrapper();
        Command::new(&wrapper[0])
            .args(&wrapper[1..])
            .arg(bin())
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap()
    }

    /// Whether the dump, read in this boot, shows `container`'s eth0 as its pod's owner.
    pub fn is_owner(&self, store: &Store, container: &str) -> bool {
        self.dump(&store.state_dir)
            .iter()
            .any(|r| r["containerId"] == container && r["ifName"] == "eth0" && r["owner"] == true)
    }

    pub fn dump(&self, state_dir: &Path) -> Vec<serde_json::Value> {
        let out = self.guard(&[
            "--dump-checkpoints",
            "--state-dir",
            state_dir.to_str().unwrap(),
            "--output",
            "json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}
