//! Mounts that give a state dir the failure modes of a real node (a full disk, a read-only
//! filesystem). Unmounted on drop, also when the test fails. Needs root; callers check
//! `sys::require` first. Needs `#[path = "support/sys.rs"] mod sys;` in the including crate.
#![allow(dead_code)]

use crate::sys::{TempDir, run, try_run};
use std::path::{Path, PathBuf};

pub struct Mount {
    pub path: PathBuf,
    /// Holds the mount point of a tmpfs; dropped (removed) only after the unmount.
    _mount_point: Option<TempDir>,
}

impl Mount {
    /// A fresh tmpfs with mount `options` (e.g. `size=256k`, `ro,mode=0700`).
    pub fn tmpfs(options: &str) -> Mount {
        let mount_point = TempDir::new("sgmnt");
        let path = mount_point.path.clone();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                options,
                "tmpfs",
                path.to_str().unwrap(),
            ],
        );
        Mount {
            path,
            _mount_point: Some(mount_point),
        }
    }

    /// A fresh ext4 on a loop device, made with mkfs.ext4 `-O features` (`^has_journal`: none,
    /// as on a node whose root was made so): what a file system does at fsync shows under it.
    pub fn ext4(features: &str) -> Mount {
        Mount::image(&["mkfs.ext4", "-q", "-F", "-O", features])
    }

    /// A fresh file system on a loop device, made by `mkfs` (its command and options; the
    /// image file is appended).
    pub fn image(mkfs: &[&str]) -> Mount {
        let mount_point = TempDir::new("sgimg");
        let image = mount_point.path.with_extension("img");
        // Sparse: XFS wants 300 MiB at least, and only what is written takes room.
        std::fs::File::create(&image)
            .unwrap()
            .set_len(320 << 20)
            .unwrap();
        let image_path = image.to_str().unwrap();
        run(mkfs[0], &[&mkfs[1..], &[image_path]].concat());
        let path = mount_point.path.clone();
        // The loop device goes with the unmount (autoclear); the image file is no longer needed.
        run("mount", &["-o", "loop", image_path, path.to_str().unwrap()]);
        let _ = std::fs::remove_file(&image);
        Mount {
            path,
            _mount_point: Some(mount_point),
        }
    }

    /// `dir` bind-mounted read-only over itself: the directory stays as it was, writes fail.
    pub fn read_only_bind(dir: &Path) -> Mount {
        let path = dir.to_str().unwrap();
        run("mount", &["--bind", path, path]);
        let mount = Mount {
            path: dir.to_path_buf(),
            _mount_point: None,
        };
        run("mount", &["-o", "remount,bind,ro", path]);
        mount
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let path = self.path.to_str().unwrap();
        if !try_run("umount", &[path]) {
            // Busy (a plugin still running after a failure): detach it so the run can go on.
            try_run("umount", &["-l", path]);
        }
    }
}
