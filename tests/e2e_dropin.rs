//! `--install --mode dropin` under libcni 1.3 (its source, vendored, built into the same
//! driver as tests/support/libcni.rs builds from Debian's 1.1): the guard's drop-in
//! `<confdir>/<network>/sandbox-guard.conf` runs in the network's chain without a byte of the
//! primary's conflist changed. The reference bridge with host-local is the primary. The same
//! conf dir through libcni 1.1, which knows no drop-ins, shows the test can tell: no
//! checkpoint there. Then the stale DEL is refused through the drop-in (it is appended last,
//! so it runs first on DEL), and after `--uninstall` the next sandbox is not checkpointed.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/install.rs"]
mod install;
#[path = "support/libcni.rs"]
mod libcni;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use libcni::{NetnsArg, Sandbox, bridge_network, driver, driver_1_3};
use serde_json::Value;

#[test]
fn dropin_runs_in_the_chain_under_libcni_1_3() {
    sys::skip_unless_root!(&[libcni::TOOLS, &[libcni::LIBCNI_1_3]].concat());
    let net = bridge_network().through(driver_1_3());
    // The primary's own conflist: the guard the example lists last taken out.
    let mut list: Value = serde_json::from_slice(&std::fs::read(&net.conflist).unwrap()).unwrap();
    let guard = list["plugins"].as_array_mut().unwrap().pop().unwrap();
    assert_eq!(guard["type"], "sandbox-guard");
    std::fs::write(&net.conflist, serde_json::to_vec_pretty(&list).unwrap()).unwrap();
    let primary_bytes = std::fs::read(&net.conflist).unwrap();

    let state_dir = net.state_dir.to_str().unwrap();
    let said = install::run_ok(
        "--install",
        net.conf_dir(),
        &net.bin_dir,
        &[
            "--mode",
            "dropin",
            "--network",
            &net.name,
            "--state-dir",
            state_dir,
        ],
    );
    let dropin = net.conf_dir().join(&net.name).join("sandbox-guard.conf");
    assert!(
        said.contains("wrote the drop-in") && dropin.exists(),
        "{said}"
    );
    assert_eq!(
        std::fs::read(&net.conflist).unwrap(),
        primary_bytes,
        "dropin mode touched the primary's conflist"
    );

    // libcni 1.1 ignores the drop-in: the pod is attached but nothing is checkpointed.
    let old_libcni = Sandbox::new("shop", "cart-0", "uid-old-libcni");
    net.add_through(driver(), &old_libcni)
        .unwrap_or_else(|e| panic!("ADD through libcni 1.1: {}", e.stderr));
    assert!(
        !net.state_dir.exists(),
        "libcni 1.1 ran the drop-in: the guard made its state dir"
    );

    let first = Sandbox::new("shop", "web-0", "uid-1");
    net.add(&first)
        .unwrap_or_else(|e| panic!("ADD through libcni 1.3: {}", e.stderr));
    let record = net
        .checkpoint(&first)
        .expect("the drop-in guard checkpointed the ADD");
    assert_eq!(record["podName"], "web-0");

    let second = Sandbox::new("shop", "web-0", "uid-2");
    net.add(&second)
        .unwrap_or_else(|e| panic!("ADD through libcni 1.3: {}", e.stderr));
    let refused = net
        .del(&first, NetnsArg::Sandbox)
        .expect_err("the stale DEL must be refused by the drop-in");
    assert_eq!(refused.code, Some(11), "{}", refused.stderr);
    assert!(refused.stderr.contains("stale DEL"), "{}", refused.stderr);
    assert!(
        libcni::pod_has_link(&second, libcni::IFNAME),
        "the new sandbox lost its interface"
    );

    install::run_ok(
        "--uninstall",
        net.conf_dir(),
        &net.bin_dir,
        &["--network", &net.name],
    );
    assert!(
        !dropin.exists() && !dropin.parent().unwrap().exists(),
        "the drop-in or its directory stayed"
    );
    assert_eq!(std::fs::read(&net.conflist).unwrap(), primary_bytes);
    let later = Sandbox::new("shop", "web-1", "uid-3");
    net.add(&later)
        .unwrap_or_else(|e| panic!("ADD after the uninstall: {}", e.stderr));
    assert!(
        net.checkpoint(&later).is_none(),
        "checkpointed after the uninstall"
    );
    for sandbox in [&second, &first, &later, &old_libcni] {
        net.del(sandbox, NetnsArg::Sandbox)
            .unwrap_or_else(|e| panic!("DEL without the guard: {}", e.stderr));
    }
}
