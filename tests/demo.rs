//! README's demo, run as a newcomer runs it (`bash scripts/demo.sh`), with the plugin under
//! test (`cni::bin()`) handed to it in place of its own build. The demo checks every act
//! itself (the unguarded DEL cuts the new pod off; the chained guard refuses it; delegate mode
//! defers and replays it) and exits non-zero, saying which, when one goes otherwise: a demo
//! nobody runs can fail for days unseen.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use std::path::Path;
use std::process::Command;

#[test]
fn the_readme_demo_plays_all_three_acts() {
    sys::skip_unless_root!(&[
        "go",
        "ip",
        "ping",
        "unshare",
        "/usr/share/gocode/src/github.com/containernetworking/cni/libcni",
    ]);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(repo.join("scripts/demo.sh"))
        .env("DEMO_PLUGIN", cni::bin())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the demo failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for act in ["no guard", "chained", "delegate"] {
        assert!(
            stdout
                .lines()
                .any(|line| line.trim_start().starts_with(act)),
            "the summary names no outcome of {act}:\n{stdout}"
        );
    }
    assert!(stdout.contains("Demo complete"), "{stdout}");
}
