//! The primary plugin's result as ADD and CHECK receive it: checked against the result shape
//! of its cniVersion (code 6, and nothing written, when it is not a result), and printed by
//! ADD in the config's cniVersion, converted as libcni converts results when the versions
//! differ. DEL never checks it: a malformed cached result must not block a teardown.

#[path = "support/cni.rs"]
mod cni;
#[path = "support/primary.rs"]
mod primary;
#[path = "support/sys.rs"]
mod sys;
#[path = "support/testdata.rs"]
mod testdata;

use cni::{NETWORK, Pod, Store, container_id};
use serde_json::{Value, json};
use testdata::fixture;

/// Results that are not results (testdata/results/malformed/), with what the error must name.
const NOT_RESULTS: [(&str, &str, &str); 8] = [
    ("an array", "array.json", "prevResult"),
    ("an empty object", "empty-object.json", "cniVersion"),
    (
        "interfaces a string, no cniVersion",
        "interfaces-string-no-version.json",
        "cniVersion",
    ),
    (
        "interfaces a string",
        "interfaces-string.json",
        "prevResult.interfaces",
    ),
    (
        "an IP on an interface the result does not have",
        "ip-on-missing-interface.json",
        "prevResult.ips[0].interface",
    ),
    (
        "a route dst without prefix",
        "route-dst-without-prefix.json",
        "prevResult.routes[0].dst",
    ),
    (
        "a route dst that is no CIDR",
        "route-dst-not-cidr.json",
        "prevResult.routes[0].dst",
    ),
    (
        "a bare address",
        "bare-address.json",
        "prevResult.ips[0].address",
    ),
];

/// The result of testdata/results/<file>.
fn result(file: &str) -> String {
    fixture(&format!("results/{file}"))
}

/// An ADD into a fresh store at `version` whose prevResult is testdata/results/<file>,
/// refused with `code` and the store unchanged (`what` says which case failed).
fn add_refused(version: &str, file: &str, code: u64, what: &str) -> cni::CniError {
    let store = Store::new();
    let call = store
        .add(&container_id(), &Pod::new("default", "web-0"))
        .version(version)
        .prev_result_raw(&result(file));
    assert_refused_untouched(&store, call, code, what)
}

/// NOT_RESULTS with each file read.
fn not_results() -> impl Iterator<Item = (&'static str, String, &'static str)> {
    NOT_RESULTS
        .into_iter()
        .map(|(what, file, names)| (what, result(&format!("malformed/{file}")), names))
}

/// Runs `call`, expects code `code` and an unchanged store; returns the error's text.
fn assert_refused_untouched(store: &Store, call: cni::Cni, code: u64, what: &str) -> cni::CniError {
    let before = store.snapshot();
    let existed = store.state_dir.exists();
    let reply = call.run();
    let error = reply.assert_error(code);
    assert_eq!(store.snapshot(), before, "{what}: the state dir changed");
    assert_eq!(
        store.state_dir.exists(),
        existed,
        "{what}: the state dir was created"
    );
    error
}

#[test]
fn add_refuses_what_is_not_a_result_with_code_6_and_writes_nothing() {
    // One store that holds a checkpoint; for each case also a fresh one whose state dir does
    // not exist yet and must not be created.
    let settled = Store::new();
    settled
        .add(&container_id(), &Pod::new("default", "settled-0"))
        .version("1.0.0")
        .run()
        .assert_ok();
    let mut failures = Vec::new();
    for (what, raw, names) in not_results() {
        let fresh = Store::new();
        for store in [&fresh, &settled] {
            let container = container_id();
            let call = store
                .add(&container, &Pod::new("default", "web-0"))
                .version("1.0.0")
                .prev_result_raw(&raw);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let error = assert_refused_untouched(store, call, 6, what);
                assert!(
                    error.msg.contains(names),
                    "{what}: msg must name {names}: {error:?}"
                );
                assert!(
                    error.msg.len() <= 200 && !error.msg.contains('\n'),
                    "{what}: msg must be one short sentence: {error:?}"
                );
                assert!(
                    error.details.contains("must return a valid CNI")
                        && error.details.contains("1.0.0"),
                    "{what}: details must say the way out: {error:?}"
                );
            }));
            if let Err(panic) = outcome {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| "panic".into());
                let which = if std::ptr::eq(store, &fresh) {
                    "fresh"
                } else {
                    "settled"
                };
                failures.push(format!("{what} ({which} store): {why}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} results mishandled:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn the_out_of_range_interface_is_named_with_its_count() {
    let error = add_refused(
        "1.0.0",
        "malformed/ip-interface-3-of-1.json",
        6,
        "interface 3 of 1",
    );
    assert!(
        error
            .msg
            .contains("prevResult.ips[0].interface 3 is out of range: the result has 1 interface"),
        "{error:?}"
    );
}

#[test]
fn add_refuses_a_pre_1_0_version_field_of_the_wrong_family() {
    let error = add_refused(
        "0.4.0",
        "malformed/ip-version-6-on-ipv4.json",
        6,
        "version 6 on an IPv4 address",
    );
    assert!(error.msg.contains("prevResult.ips[0].version"), "{error:?}");
}

#[test]
fn check_refuses_what_is_not_a_result_before_reading_the_store() {
    let store = Store::new();
    let pod = Pod::new("default", "web-0");
    let a = container_id();
    store.add(&a, &pod).version("1.0.0").run().assert_ok();
    for (what, raw, names) in not_results() {
        let call = store
            .cni("CHECK", &a)
            .pod(&pod)
            .version("1.0.0")
            .prev_result_raw(&raw);
        let error = assert_refused_untouched(&store, call, 6, what);
        assert!(
            error.msg.contains(names),
            "CHECK, {what}: msg must name {names}: {error:?}"
        );
    }
}

#[test]
fn del_does_not_check_the_cached_result() {
    let store = Store::new();
    let pod = Pod::new("default", "web-0");
    for (what, raw, _) in not_results() {
        let a = container_id();
        store.add(&a, &pod).version("1.0.0").run().assert_ok();
        let reply = store
            .del(&a, &pod)
            .version("1.0.0")
            .prev_result_raw(&raw)
            .run();
        assert!(
            reply.succeeded(),
            "DEL with {what} as prevResult must tear down: {reply:?}"
        );
        assert!(
            !store.record_path(NETWORK, &a, "eth0").exists(),
            "DEL with {what}: the record stays"
        );
    }
}

#[test]
fn a_result_in_a_version_the_guard_cannot_read_is_code_1() {
    // 0.2.0 was this case until the guard learnt 0.1.0 and 0.2.0; a newer spec is it now.
    let error = add_refused("0.4.0", "1.2.0.json", 1, "a 1.2.0 result");
    assert!(error.msg.contains("1.2.0"), "{error:?}");
}

#[test]
fn a_legacy_result_that_does_not_parse_is_code_6_and_writes_nothing() {
    for (file, names) in [
        ("legacy-ip-without-prefix.json", "prevResult.ip4.ip"),
        ("legacy-ip4-a-string.json", "prevResult.ip4"),
        ("legacy-ip4-ipv6.json", "prevResult.ip4.ip"),
    ] {
        for version in ["0.1.0", "0.2.0", "1.0.0"] {
            let store = Store::new();
            let call = store
                .add(&container_id(), &Pod::new("default", "web-0"))
                .version(version)
                .prev_result_raw(&result(&format!("malformed/{file}")));
            let error = assert_refused_untouched(&store, call, 6, file);
            assert!(error.msg.contains(names), "{file} at {version}: {error:?}");
            assert!(
                store
                    .log_lines()
                    .iter()
                    .all(|l| l.outcome != cni::Outcome::Added),
                "{file} at {version}: a success was logged"
            );
            assert!(
                error.details.contains("must return a valid CNI 0."),
                "{file} at {version}: {error:?}"
            );
        }
    }
}

#[test]
fn a_config_version_that_is_none_of_the_known_ones_is_code_1_and_writes_nothing() {
    for version in ["0.2.1", "0.5.0", "1.2.0", "v1.0.0", "1.0"] {
        let store = Store::new();
        let call = store
            .add(&container_id(), &Pod::new("default", "web-0"))
            .version(version)
            .prev_result_raw(&result("0.2.0.json"));
        let error = assert_refused_untouched(&store, call, 1, version);
        assert!(
            error.msg.contains("is not supported") && error.msg.contains("0.1.0"),
            "{version}: {error:?}"
        );
        // The only line is the refusal itself (a rejected config is logged and counted, so a
        // bad install shows in the log): none of success.
        let lines = store.log_lines();
        assert!(
            lines.iter().all(|l| l.outcome == cni::Outcome::Rejected),
            "{version}: {:?}",
            lines.iter().map(|l| &l.raw).collect::<Vec<_>>()
        );
    }
}

#[test]
fn legacy_results_pass_through_at_their_version_and_are_checkpointed() {
    let store = Store::new();
    for version in ["0.1.0", "0.2.0"] {
        let raw = result(&format!("{version}.json"));
        let (a, pod) = (
            container_id(),
            Pod::new("default", &format!("legacy-{}", version.replace('.', "-"))),
        );
        let reply = store
            .add(&a, &pod)
            .version(version)
            .prev_result_raw(&raw)
            .run();
        reply.assert_ok();
        assert_eq!(
            reply.stdout.strip_suffix('\n').unwrap_or(&reply.stdout),
            raw.trim_end(),
            "ADD at {version} prints the result unchanged"
        );
        let stored = store
            .entry(&a, "eth0")
            .unwrap_or_else(|| panic!("ADD at {version} is checkpointed"));
        assert_eq!(
            stored["prevResult"],
            serde_json::from_str::<Value>(&raw).unwrap(),
            "{version}"
        );
        // libcni sends no prevResult on DEL below 0.4.0.
        store.del(&a, &pod).version(version).run().assert_ok();
        assert!(
            store.entry(&a, "eth0").is_none(),
            "DEL at {version} removes the checkpoint"
        );
    }
}

/// libcni's own conversion of `raw` to `version` (tests/libcni-convert, built against the
/// vendored libcni 1.3); `Err` with libcni's message when it cannot convert.
fn libcni_converts(converter: &std::path::Path, raw: &str, version: &str) -> Result<Value, String> {
    use std::io::Write;
    let mut child = std::process::Command::new(converter)
        .arg(version)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run libcni-convert");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(raw.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).expect("libcni-convert prints JSON"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Go marshals an empty DNS struct as `{}` before 1.0 and leaves it out after; the guard
/// keeps what the result had. Neither tells the runtime anything.
fn without_empty_dns(mut result: Value) -> Value {
    if result
        .get("dns")
        .is_some_and(|dns| dns.as_object().is_some_and(|o| o.is_empty()))
    {
        result.as_object_mut().unwrap().remove("dns");
    }
    result
}

/// tests/libcni-convert built against the vendored libcni 1.3.
fn built_libcni_convert() -> std::path::PathBuf {
    let out_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("libcni-convert");
    let vendored = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vendor/cni-1.3.0");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/build-libcni-driver.sh"
    );
    sys::run(
        "bash",
        &[
            script,
            out_dir.to_str().unwrap(),
            vendored,
            "libcni-convert",
        ],
    );
    out_dir.join("libcni-convert")
}

#[test]
fn conversions_to_and_from_legacy_versions_are_libcnis() {
    sys::skip_unless_tools!(&["go", "bash"]);
    let converter = built_libcni_convert();
    let inputs = [
        "0.1.0.json",
        "0.2.0.json",
        "0.3.1.json",
        "legacy/dual-stack-0.2.0.json",
        "legacy/ipv6-only-0.1.0.json",
        "legacy/many-1.1.0.json",
        "legacy/unversioned-ip-0.4.0.json",
        "legacy/no-ip-1.0.0.json",
    ];
    let legacy = |v: &str| v == "0.1.0" || v == "0.2.0";
    let mut failures = Vec::new();
    let mut compared = 0;
    for file in inputs {
        let raw = result(file);
        let from: Value = serde_json::from_str(&raw).unwrap();
        let from = from["cniVersion"].as_str().unwrap().to_string();
        for to in cni::SUPPORTED_VERSIONS {
            if to == from || !(legacy(&from) || legacy(to)) {
                continue;
            }
            let store = Store::new();
            let a = container_id();
            let before = store.snapshot();
            let reply = store
                .add(&a, &Pod::new("default", "conv"))
                .version(to)
                .prev_result_raw(&raw)
                .run();
            compared += 1;
            match libcni_converts(&converter, &raw, to) {
                Ok(expected) => {
                    if !reply.succeeded() {
                        failures.push(format!(
                            "{file} -> {to}: libcni converts it, the guard refused: {reply:?}"
                        ));
                    } else if without_empty_dns(reply.json()) != without_empty_dns(expected.clone())
                    {
                        failures.push(format!(
                            "{file} -> {to}:\n  guard  {}\n  libcni {expected}",
                            reply.json()
                        ));
                    }
                }
                Err(why) => {
                    if reply.succeeded() {
                        failures.push(format!(
                            "{file} -> {to}: libcni cannot convert it ({why}), the guard did"
                        ));
                    } else {
                        let error = reply.assert_error(6);
                        assert!(
                            error.msg.contains("no IP address"),
                            "{file} -> {to}: {error:?}"
                        );
                        assert_eq!(
                            store.snapshot(),
                            before,
                            "{file} -> {to}: a refused ADD wrote to the store"
                        );
                    }
                }
            }
        }
    }
    assert!(compared >= 30, "only {compared} conversions compared");
    assert!(
        failures.is_empty(),
        "{} conversions differ from libcni's:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn results_libcni_reads_are_added_in_both_modes_and_converted_as_libcni_converts_them() {
    // An IP with `"version": ""`, a `"gateway": ""` or route `"gw": ""` (Go's net.IP reads ""
    // as none), an IPv4-mapped IPv6 address (IPv4 to libcni: To4() != nil): libcni reads each,
    // so a primary's result with them must not fail the ADD, chained or delegated, and a
    // converted one must read as libcni's conversion reads.
    sys::skip_unless_tools!(&["go", "bash"]);
    let converter = built_libcni_convert();
    let inputs = testdata::fixtures_in("results/libcni-reads");
    assert!(inputs.len() >= 6, "{inputs:?}");
    let mut failures = Vec::new();
    for file in &inputs {
        let raw = fixture(file);
        let raw = raw.trim_end();
        let from: Value = serde_json::from_str(raw).unwrap();
        let from = from["cniVersion"].as_str().unwrap().to_string();
        for to in cni::SUPPORTED_VERSIONS {
            let expected = libcni_converts(&converter, raw, to);
            for delegated in [false, true] {
                let mode = if delegated { "delegate" } else { "chained" };
                let store = Store::new();
                let primary = primary::RecordingPrimary::new();
                let a = container_id();
                let call = store.add(&a, &Pod::new("default", "reads")).version(to);
                let reply = if delegated {
                    primary.answer_add(&a, raw);
                    primary.wrap(call).run()
                } else {
                    call.prev_result_raw(raw).run()
                };
                let case = format!("{file} -> {to} ({mode})");
                match (&expected, reply.succeeded()) {
                    (Ok(_), true) if to == from => {
                        if reply.stdout.trim_end() != raw {
                            failures.push(format!("{case}: not passed through: {}", reply.stdout));
                        }
                    }
                    (Ok(expected), true) => {
                        if without_empty_dns(reply.json()) != without_empty_dns(expected.clone()) {
                            failures.push(format!(
                                "{case}:\n  guard  {}\n  libcni {expected}",
                                reply.json()
                            ));
                        }
                    }
                    (Ok(_), false) => failures.push(format!(
                        "{case}: libcni reads it, the guard refused: {reply:?}"
                    )),
                    (Err(_), false) => {
                        let error = reply.assert_error(6);
                        if !error.msg.contains("no IP address") {
                            failures.push(format!("{case}: {error:?}"));
                        }
                    }
                    (Err(why), true) => failures.push(format!(
                        "{case}: libcni cannot convert it ({why}), the guard did"
                    )),
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} results read otherwise than libcni reads them:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// ADD's output parsed, and the checkpoint's copy of the prevResult.
fn add_output_and_checkpoint(store: &Store, version: &str, raw: &str) -> (Value, Value) {
    let a = container_id();
    let reply = store
        .add(
            &a,
            &Pod::new("default", &format!("conv-{}", version.replace('.', "-"))),
        )
        .version(version)
        .prev_result_raw(raw)
        .run();
    reply.assert_ok();
    let entry = store.entry(&a, "eth0").expect("the ADD is checkpointed");
    (reply.json(), entry["prevResult"].clone())
}

#[test]
fn add_converts_a_0_4_0_result_to_a_1_0_0_config() {
    let store = Store::new();
    let raw = result("0.4.0.json");
    let a = container_id();
    let reply = store
        .add(&a, &Pod::new("default", "web-0"))
        .version("1.0.0")
        .prev_result_raw(&raw)
        .run();
    reply.assert_ok();
    // Unknown members keep their very text, numbers no double can hold included.
    assert!(
        reply
            .stdout
            .contains(r#""x-vendor":{"big":123456789012345678901234567890,"f":1.0e2}"#),
        "{}",
        reply.stdout
    );
    let out = reply.json();
    assert_eq!(out["cniVersion"], "1.0.0");
    assert_eq!(
        out["ips"],
        json!([
            {"address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 0},
            {"address": "fd00::5/64", "interface": 0}
        ]),
        "1.0.0 has no ips[].version"
    );
    let input: Value = serde_json::from_str(&raw).unwrap();
    for key in ["interfaces", "routes", "dns"] {
        assert_eq!(out[key], input[key], "{key} is unchanged");
    }
    // The checkpoint keeps what the runtime passed.
    assert_eq!(store.entry(&a, "eth0").unwrap()["prevResult"], input);
}

#[test]
fn add_converts_a_1_0_0_result_to_a_0_4_0_config() {
    let store = Store::new();
    let raw = result("1.0.0.json");
    let (out, stored) = add_output_and_checkpoint(&store, "0.4.0", &raw);
    assert_eq!(out["cniVersion"], "0.4.0");
    assert_eq!(out["ips"][0]["version"], "4");
    assert_eq!(out["ips"][1]["version"], "6");
    assert_eq!(out["ips"][0]["address"], "10.22.0.5/16");
    assert_eq!(out["x-vendor"], json!([1, "two"]));
    assert_eq!(out["interfaces"][0]["x-if"], "kept");
    assert_eq!(
        stored,
        serde_json::from_str::<Value>(&raw).unwrap(),
        "the checkpoint keeps what the runtime passed"
    );
}

#[test]
fn add_converts_a_1_1_0_result_down_as_libcni_does() {
    let store = Store::new();
    let raw = result("1.1.0.json");
    let (out, _) = add_output_and_checkpoint(&store, "0.3.1", &raw);
    assert_eq!(out["cniVersion"], "0.3.1");
    assert_eq!(
        out["interfaces"],
        json!([{"name":"eth0","mac":"0a:58:0a:16:00:05","sandbox":"/var/run/netns/x"}])
    );
    assert_eq!(
        out["ips"],
        json!([{"version":"4","address":"10.22.0.5/16","interface":0}])
    );
    assert_eq!(
        out["routes"],
        json!([{"dst":"0.0.0.0/0","mtu":1400,"table":100}])
    );
    // 1.1.0 -> 1.0.0 changes the version only.
    let (out, _) = add_output_and_checkpoint(&store, "1.0.0", &raw);
    let mut expected: Value = serde_json::from_str(&raw).unwrap();
    expected["cniVersion"] = json!("1.0.0");
    assert_eq!(out, expected);
}

#[test]
fn same_version_output_is_byte_identical() {
    let store = Store::new();
    // Odd spacing, exponents, escapes, a trailing tab: any re-serialisation would show.
    for version in ["0.3.0", "0.4.0", "1.1.0"] {
        let raw = result(&format!("verbatim/{version}.json"));
        let a = container_id();
        let reply = store
            .add(
                &a,
                &Pod::new("default", &format!("same-{}", version.replace('.', "-"))),
            )
            .version(version)
            .prev_result_raw(&raw)
            .run();
        reply.assert_ok();
        assert_eq!(
            reply.stdout.strip_suffix('\n').unwrap_or(&reply.stdout),
            raw.trim_end(),
            "{version}"
        );
    }
}

#[test]
fn a_result_of_each_version_passes_through_at_its_version() {
    let store = Store::new();
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let raw = result(&format!("{version}.json"));
        let (a, pod) = (
            container_id(),
            Pod::new("default", &format!("pass-{}", version.replace('.', "-"))),
        );
        let reply = store
            .add(&a, &pod)
            .version(version)
            .prev_result_raw(&raw)
            .run();
        reply.assert_ok();
        assert_eq!(
            reply.stdout.strip_suffix('\n').unwrap_or(&reply.stdout),
            raw.trim_end(),
            "ADD at {version} prints the result unchanged"
        );
        let stored = store
            .entry(&a, "eth0")
            .unwrap_or_else(|| panic!("ADD at {version} is checkpointed"));
        assert_eq!(
            stored["prevResult"],
            serde_json::from_str::<Value>(&raw).unwrap(),
            "{version}"
        );
        store
            .del(&a, &pod)
            .version(version)
            .prev_result_raw(&raw)
            .run()
            .assert_ok();
        assert!(
            store.entry(&a, "eth0").is_none(),
            "DEL at {version} removes the checkpoint"
        );
    }
}

/// A version string is the runtime's input: echoed whole, a huge one makes the error (and
/// the runtime's log of it) as large as stdin allows. The message names it shortened, as
/// every other value the guard quotes.
#[test]
fn a_huge_config_version_is_named_short_in_a_code_1_error() {
    let huge = "9".repeat(200_000);
    for verb_call in ["ADD", "DEL"] {
        let store = Store::new();
        let call = match verb_call {
            "ADD" => store.add(&container_id(), &Pod::new("default", "web-0")),
            _ => store.del(&container_id(), &Pod::new("default", "web-0")),
        };
        let reply = call.version(&huge).run();
        let error = reply.assert_error(1);
        assert!(
            error.msg.len() < 512,
            "{verb_call}: the error's msg is {} bytes long",
            error.msg.len()
        );
        assert!(
            reply.stderr.len() < 4096,
            "{verb_call}: stderr is {} bytes long",
            reply.stderr.len()
        );
        assert!(
            !store.state_dir.exists(),
            "{verb_call}: a refused version wrote the state dir"
        );
    }
}

/// A 0.2.0 IP config with members that 0.3.0 and later define for an IP (`version`,
/// `interface`, `address`): libcni reads only `ip`, `gateway` and `routes` and converts it;
/// kept as unknown members they would collide with the converted IP's own (a key twice) or
/// point at an interface the result does not have. (0.1.0 keeps them: unknown members stay
/// between the legacy versions.)
#[test]
fn a_legacy_ip_with_members_newer_versions_define_converts_up_as_libcni_converts_it() {
    sys::skip_unless_tools!(&["go", "bash"]);
    let converter = built_libcni_convert();
    let raw = result("legacy/ip-with-newer-keys-0.2.0.json");
    let mut failures = Vec::new();
    for to in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let store = Store::new();
        let reply = store
            .add(&container_id(), &Pod::new("default", "conv"))
            .version(to)
            .prev_result_raw(&raw)
            .run();
        let expected = libcni_converts(&converter, &raw, to).expect("libcni converts it");
        if !reply.succeeded() {
            failures.push(format!(
                "-> {to}: libcni converts it, the guard refused: {}",
                reply.stdout
            ));
        } else if without_empty_dns(reply.json()) != without_empty_dns(expected.clone()) {
            failures.push(format!(
                "-> {to}:\n  guard  {}\n  libcni {expected}",
                reply.json()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
