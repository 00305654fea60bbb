use super::*;
use serde_json::{Value, json};
use std::borrow::Cow;

fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_string()).unwrap()
}

fn validate(text: &str) -> Result<ResultView> {
    ResultView::validated(&raw(text), "1.0.0")
}

/// The code and msg of a result that fails validation.
fn refusal(text: &str) -> (u32, String) {
    let err = validate(text).expect_err(text);
    assert!(
        !err.msg.is_empty() && err.msg.len() <= 200,
        "msg must be short: {:?}",
        err.msg
    );
    assert!(
        !err.msg.contains('\n'),
        "msg must be one line: {:?}",
        err.msg
    );
    assert!(
        err.details.contains("plugin before sandbox-guard"),
        "details must say the way out: {err:?}"
    );
    (err.code(), err.msg)
}

fn converted(text: &str, to: &str) -> Value {
    let raw = raw(text);
    ResultView::validated(&raw, to).unwrap();
    serde_json::from_str(&as_version(&raw, to).unwrap()).unwrap()
}

#[test]
fn reads_a_result() {
    let view = ResultView::parse(&raw(
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/run/netns/x"}],
               "ips":[{"address":"10.1.0.9/24","gateway":"10.1.0.1","interface":0}],"routes":[{"dst":"0.0.0.0/0"}],"custom":1}"#,
        ))
        .unwrap();
    assert_eq!(view.cidrs(), vec!["10.1.0.9/24"]);
    assert_eq!(view.interfaces[0].mac.as_deref(), Some("aa:bb:cc:dd:ee:ff"));
}

#[test]
fn rejects_what_is_not_a_result() {
    for text in [
        r#""a string""#,
        r#"{"ips":"10.0.0.1"}"#,
        r#"{"ips":[{"address":"not-a-cidr"}]}"#,
        r#"{"ips":[{"address":"10.0.0.1"}]}"#,
        "[1]",
    ] {
        assert_eq!(
            ResultView::parse(&raw(text)).unwrap_err().code(),
            6,
            "{text}"
        );
    }
}

#[test]
fn validates_a_full_result_of_every_version_and_reads_it() {
    for version in crate::cni::version::SUPPORTED
        .into_iter()
        .filter(|v| shape_of(v) != Some(Shape::Legacy))
    {
        let pre1 = version.starts_with("0.");
        let mut ip =
            json!({"address": "10.1.0.9/24", "gateway": "10.1.0.1", "interface": 0, "x-ip": [1]});
        let mut ip6 = json!({"address": "fd00::9/64", "interface": 1});
        if pre1 {
            ip["version"] = json!("4");
            ip6["version"] = json!("6");
        }
        let mut interface = json!({"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": "/run/netns/x", "x-if": {}});
        let mut route = json!({"dst": "0.0.0.0/0", "gw": "10.1.0.1"});
        if version == "1.1.0" {
            interface["mtu"] = json!(1500);
            interface["socketPath"] = json!("/run/vhost.sock");
            interface["pciID"] = json!("0000:00:1f.6");
            route["mtu"] = json!(1400);
            route["advmss"] = json!(1360);
            route["priority"] = json!(100);
            route["table"] = json!(254);
            route["scope"] = json!(0);
        }
        let result = json!({
            "cniVersion": version,
            "interfaces": [interface, {"name": "veth1"}],
            "ips": [ip, ip6],
            "routes": [route],
            "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local", "search": ["svc"], "options": ["ndots:5"]},
            "x-top": 1e300
        });
        let view = ResultView::validated(&raw(&result.to_string()), version)
            .unwrap_or_else(|e| panic!("{version}: {e}"));
        assert_eq!(view.cidrs(), vec!["10.1.0.9/24", "fd00::9/64"]);
        assert_eq!(view.interfaces[0].mac.as_deref(), Some("aa:bb:cc:dd:ee:ff"));
        assert_eq!(view.interfaces[0].sandbox.as_deref(), Some("/run/netns/x"));
        assert_eq!(view.routes[0].gw, Some("10.1.0.1".parse().unwrap()));
    }
}

#[test]
fn every_supported_version_has_a_shape() {
    for version in crate::cni::version::SUPPORTED {
        assert!(shape_of(version).is_some(), "{version}");
    }
}

#[test]
fn the_result_must_be_an_object_with_a_string_cni_version() {
    for (text, says) in [
        ("[]", "is an array"),
        ("{}", "no cniVersion"),
        (r#"{"interfaces":"0"}"#, "no cniVersion"),
        ("null", "is null"),
        ("42", "is a number"),
        (r#"{"cniVersion":1}"#, "cniVersion is a number"),
        (r#"{"cniVersion":null}"#, "no cniVersion"),
        (r#"{"cniVersion":"one"}"#, "not a CNI version"),
        (r#"{"cniVersion":"1.0.0","cniVersion":"1.0.0"}"#, "twice"),
    ] {
        let (code, msg) = refusal(text);
        assert_eq!(code, 6, "{text}: {msg}");
        assert!(msg.contains(says), "{text}: {msg}");
    }
}

#[test]
fn a_version_the_guard_does_not_read_is_code_1() {
    for version in ["0.2.1", "0.5.0", "1.2.0", "2.0.0"] {
        let err =
            validate(&json!({"cniVersion": version, "ip4": {"ip": "10.0.0.2/24"}}).to_string())
                .unwrap_err();
        assert_eq!(err.code(), 1, "{version}: {err}");
        assert!(err.msg.contains(version), "{err}");
    }
}

#[test]
fn interfaces_are_objects_with_a_name() {
    for (text, says) in [
        (
            r#"{"cniVersion":"1.0.0","interfaces":"0"}"#,
            "prevResult.interfaces is a string, not an array",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[3]}"#,
            "prevResult.interfaces[0] is a number, not an object",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[null]}"#,
            "prevResult.interfaces[0] is null",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[{}]}"#,
            "prevResult.interfaces[0] has no name",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":""}]}"#,
            "prevResult.interfaces[0].name is empty",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":7}]}"#,
            "prevResult.interfaces[0].name is a number",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"a","mac":false}]}"#,
            "prevResult.interfaces[0].mac is a boolean",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"a","sandbox":{}}]}"#,
            "prevResult.interfaces[0].sandbox is an object",
        ),
        (
            r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","mtu":-1}]}"#,
            "prevResult.interfaces[0].mtu -1 is not an unsigned integer",
        ),
        (
            r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","mtu":"1500"}]}"#,
            "mtu is a string",
        ),
        (
            r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","mtu":1.5}]}"#,
            "not an unsigned integer",
        ),
        (
            r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","socketPath":1}]}"#,
            "socketPath is a number",
        ),
        (
            r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","pciID":[]}]}"#,
            "pciID is an array",
        ),
    ] {
        let (code, msg) = refusal(text);
        assert_eq!(code, 6, "{text}: {msg}");
        assert!(msg.contains(says), "{text}: {msg}");
    }
    // 1.1.0's fields are unknown keys before 1.1.0: anything goes.
    validate(r#"{"cniVersion":"1.0.0","interfaces":[{"name":"a","mtu":"big","pciID":[]}]}"#)
        .unwrap();
    // null is absent, as libcni's decoder reads it.
    validate(r#"{"cniVersion":"1.0.0","interfaces":null,"ips":null,"routes":null,"dns":null}"#)
        .unwrap();
    validate(r#"{"cniVersion":"1.1.0","interfaces":[{"name":"a","mac":null,"mtu":null}]}"#)
        .unwrap();
}

#[test]
fn ips_are_cidrs_on_interfaces_that_exist() {
    for (text, says) in [
        (
            r#"{"cniVersion":"1.0.0","ips":{}}"#,
            "prevResult.ips is an object, not an array",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{}]}"#,
            "prevResult.ips[0] has no address",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2"}]}"#,
            "prevResult.ips[0].address \"10.0.0.2\" has no prefix length",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/33"}]}"#,
            "is not an address in CIDR form",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0/24"}]}"#,
            "is not an address in CIDR form",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/+4"}]}"#,
            "is not an address in CIDR form",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{"address":"fd00::1/129"}]}"#,
            "is not an address in CIDR form",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{"address":24}]}"#,
            "address is a number",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1/24"}]}"#,
            "gateway \"10.0.0.1/24\" is not an IP address",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24","interface":3}]}"#,
            "prevResult.ips[0].interface 3 is out of range: the result has 0 interfaces",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":1}]}"#,
            "prevResult.ips[0].interface 1 is out of range: the result has 1 interface",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":-1}]}"#,
            "not an unsigned integer",
        ),
        (
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":"0"}]}"#,
            "interface is a string",
        ),
        (
            r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"fd00::2/64"}]}"#,
            "version is \"4\" but the address fd00::2/64 is IPv6",
        ),
        (
            r#"{"cniVersion":"0.3.1","ips":[{"version":"6","address":"10.0.0.2/24"}]}"#,
            "version is \"6\" but the address",
        ),
        (
            r#"{"cniVersion":"0.3.0","ips":[{"version":"5","address":"10.0.0.2/24"}]}"#,
            "version \"5\" is not \"4\" or \"6\"",
        ),
        (
            r#"{"cniVersion":"0.4.0","ips":[{"version":4,"address":"10.0.0.2/24"}]}"#,
            "version is a number",
        ),
        (
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24","address":"10.0.0.3/24"}]}"#,
            "has the key \"address\" twice",
        ),
    ] {
        let (code, msg) = refusal(text);
        assert_eq!(code, 6, "{text}: {msg}");
        assert!(msg.contains(says), "{text}: {msg}");
    }
    // version is no 1.0 key, and pre-1.0 results may leave it out.
    validate(r#"{"cniVersion":"1.0.0","ips":[{"version":"6","address":"10.0.0.2/24"}]}"#).unwrap();
    validate(r#"{"cniVersion":"0.4.0","ips":[{"address":"10.0.0.2/24"}]}"#).unwrap();
    let view = validate(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}],"interfaces":[{"name":"eth0"},{"name":"lo"}]}"#).unwrap();
    assert_eq!(view.interfaces.len(), 2);
}

#[test]
fn routes_and_dns_have_their_shapes() {
    for (text, says) in [
        (
            r#"{"cniVersion":"1.0.0","routes":[{}]}"#,
            "prevResult.routes[0] has no dst",
        ),
        (
            r#"{"cniVersion":"1.0.0","routes":[{"dst":"default"}]}"#,
            "prevResult.routes[0].dst \"default\" has no prefix length",
        ),
        (
            r#"{"cniVersion":"1.0.0","routes":[{"dst":"0.0.0.0/0","gw":"gateway"}]}"#,
            "prevResult.routes[0].gw \"gateway\" is not an IP address",
        ),
        (
            r#"{"cniVersion":"1.0.0","routes":"0.0.0.0/0"}"#,
            "prevResult.routes is a string",
        ),
        (
            r#"{"cniVersion":"1.1.0","routes":[{"dst":"0.0.0.0/0","mtu":"1400"}]}"#,
            "prevResult.routes[0].mtu is a string",
        ),
        (
            r#"{"cniVersion":"1.1.0","routes":[{"dst":"0.0.0.0/0","table":1.5}]}"#,
            "prevResult.routes[0].table 1.5 is not an integer",
        ),
        (
            r#"{"cniVersion":"1.1.0","routes":[{"dst":"0.0.0.0/0","scope":1e400}]}"#,
            "prevResult.routes[0].scope 1e400 is not an integer",
        ),
        (
            r#"{"cniVersion":"1.0.0","dns":[]}"#,
            "prevResult.dns is an array, not an object",
        ),
        (
            r#"{"cniVersion":"1.0.0","dns":{"nameservers":"10.96.0.10"}}"#,
            "prevResult.dns.nameservers is a string, not an array",
        ),
        (
            r#"{"cniVersion":"1.0.0","dns":{"search":[1]}}"#,
            "prevResult.dns.search[0] is a number, not a string",
        ),
        (
            r#"{"cniVersion":"1.0.0","dns":{"options":[null]}}"#,
            "prevResult.dns.options[0] is null",
        ),
        (
            r#"{"cniVersion":"1.0.0","dns":{"domain":["a"]}}"#,
            "prevResult.dns.domain is an array",
        ),
    ] {
        let (code, msg) = refusal(text);
        assert_eq!(code, 6, "{text}: {msg}");
        assert!(msg.contains(says), "{text}: {msg}");
    }
    validate(r#"{"cniVersion":"1.0.0","routes":[{"dst":"0.0.0.0/0","mtu":"x"}],"dns":{}}"#)
        .unwrap();
    validate(r#"{"cniVersion":"1.1.0","routes":[{"dst":"::/0","gw":"fd00::1","priority":-1,"table":18446744073709551615}]}"#).unwrap();
}

#[test]
fn unknown_keys_are_allowed_anywhere_whatever_they_hold() {
    let text = r#"{"cniVersion":"1.1.0","x":1e400,"y":123456789012345678901234567890,"z":[[[{"q":null}]]],
            "interfaces":[{"name":"eth0","x":{"deep":[1,2]}}],"ips":[{"address":"10.0.0.2/24","x":"\u0000"}],
            "routes":[{"dst":"0.0.0.0/0","x":true}],"dns":{"x":false}}"#;
    validate(text).unwrap();
}

#[test]
fn hostile_input_is_refused_without_a_panic() {
    let deep_unknown = format!(
        r#"{{"cniVersion":"1.0.0","x":{}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    // Unknown, so never parsed: it passes (and passes through).
    validate(&deep_unknown).unwrap();
    let deep_known = format!(
        r#"{{"cniVersion":"1.0.0","dns":{{"search":{}{}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert_eq!(refusal(&deep_known).0, 6);
    let long = "9".repeat(100_000);
    let (code, msg) = refusal(&format!(
        r#"{{"cniVersion":"1.1.0","interfaces":[{{"name":"a","mtu":{long}}}]}}"#
    ));
    assert_eq!(code, 6, "{msg}");
    let (code, msg) = refusal(&format!(
        r#"{{"cniVersion":"1.0.0","ips":[{{"address":"{}"}}]}}"#,
        "\\u0001".repeat(10_000)
    ));
    assert_eq!(code, 6, "{msg}");
    let (code, msg) = refusal(&format!(r#"{{"cniVersion":"{}"}}"#, "9.".repeat(10_000)));
    assert_eq!(code, 6, "{msg}");
    let (code, msg) = refusal(
        r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/24","interface":18446744073709551616}]}"#,
    );
    assert_eq!(code, 6, "{msg}");
}

#[test]
fn same_version_output_is_the_bytes_unchanged() {
    let text = "{ \"cniVersion\" : \"0.4.0\", \"ips\":[{\"version\":\"4\",\"address\":\"10.0.0.2/24\"}], \"x\": 1.0e2 }";
    let raw = raw(text);
    assert!(matches!(as_version(&raw, "0.4.0").unwrap(), Cow::Borrowed(t) if t == text));
}

#[test]
fn converts_pre1_to_1x_dropping_ip_versions_and_keeping_unknown_members() {
    let text = r#"{"cniVersion":"0.4.0","x-top":123456789012345678901234567890,
            "interfaces":[{"name":"eth0","x-if":1}],
            "ips":[{"version":"4","address":"10.0.0.2/24","interface":0,"x-ip":[1.0e2]},{"version":"6","address":"fd00::2/64"}],
            "routes":[{"dst":"0.0.0.0/0","x-route":"r"}],"dns":{"nameservers":["10.96.0.10"],"x-dns":null}}"#;
    for to in ["1.0.0", "1.1.0"] {
        let out = as_version(&raw(text), to).unwrap().into_owned();
        // Unknown members keep their very text.
        assert!(
            out.contains(r#""x-top":123456789012345678901234567890"#),
            "{out}"
        );
        assert!(out.contains(r#""x-ip":[1.0e2]"#), "{out}");
        let out: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(out["cniVersion"], to);
        assert_eq!(
            out["ips"],
            json!([{"address":"10.0.0.2/24","interface":0,"x-ip":[100.0]},{"address":"fd00::2/64"}])
        );
        assert_eq!(out["interfaces"], json!([{"name":"eth0","x-if":1}]));
        assert_eq!(out["routes"], json!([{"dst":"0.0.0.0/0","x-route":"r"}]));
        assert_eq!(
            out["dns"],
            json!({"nameservers":["10.96.0.10"],"x-dns":null})
        );
    }
}

#[test]
fn converts_1x_to_pre1_adding_ip_versions_as_libcni_does() {
    let text = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "mtu": 1500, "socketPath": "/s", "pciID": "p", "x-if": 1}],
            "ips": [{"address": "10.0.0.2/24", "interface": 0, "version": "6"}, {"address": "fd00::2/64"}],
            "routes": [{"dst": "0.0.0.0/0", "mtu": 1400, "advmss": 1360, "priority": 1, "table": 2, "scope": 0}],
            "x-top": {"a": 1}
        })
        .to_string();
    for to in ["0.3.0", "0.3.1", "0.4.0"] {
        let out = converted(&text, to);
        assert_eq!(out["cniVersion"], to);
        assert_eq!(
            out["ips"],
            json!([{"version":"4","address":"10.0.0.2/24","interface":0},{"version":"6","address":"fd00::2/64"}])
        );
        // libcni's 0.4.0 interface has no mtu, socketPath or pciID; its route type is shared.
        assert_eq!(
            out["interfaces"],
            json!([{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","x-if":1}])
        );
        assert_eq!(
            out["routes"],
            json!([{"dst":"0.0.0.0/0","mtu":1400,"advmss":1360,"priority":1,"table":2,"scope":0}])
        );
        assert_eq!(out["x-top"], json!({"a": 1}));
    }
}

#[test]
fn converts_within_an_era_by_the_version_alone() {
    let v11 = json!({"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mtu":1500}],"ips":[{"address":"10.0.0.2/24","version":"4"}]});
    let mut expected = v11.clone();
    expected["cniVersion"] = json!("1.0.0");
    assert_eq!(converted(&v11.to_string(), "1.0.0"), expected);
    let v03 = json!({"cniVersion":"0.3.0","ips":[{"address":"10.0.0.2/24","version":"4"}],"x":[1]});
    let mut expected = v03.clone();
    expected["cniVersion"] = json!("0.4.0");
    assert_eq!(converted(&v03.to_string(), "0.4.0"), expected);
}

#[test]
fn a_conversion_must_give_a_valid_result_of_the_config_version() {
    // 1.0.0's unknown "mtu" is 1.1.0's interface MTU.
    let text = raw(r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mtu":"big"}]}"#);
    ResultView::validated(&text, "1.1.0").unwrap();
    let err = as_version(&text, "1.1.0").unwrap_err();
    assert_eq!(err.code(), 6, "{err}");
    assert!(
        err.msg.contains("prevResult.interfaces[0].mtu") && err.msg.contains("1.1.0"),
        "{err}"
    );
    assert!(err.msg.len() <= 200, "{err}");
}

#[test]
fn converting_from_a_version_the_guard_does_not_read_is_code_1() {
    let err = as_version(
        &raw(r#"{"cniVersion":"1.2.0","ips":[{"address":"10.0.0.2/24"}]}"#),
        "0.4.0",
    )
    .unwrap_err();
    assert_eq!(err.code(), 1, "{err}");
}

#[test]
fn validates_a_legacy_result_and_reads_its_addresses_and_routes() {
    for version in ["0.1.0", "0.2.0"] {
        let text = json!({
                "cniVersion": version,
                "ip4": {"ip": "10.1.0.9/24", "gateway": "10.1.0.1", "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}], "x": 1},
                "ip6": {"ip": "fd00::9/64", "routes": [{"dst": "::/0"}]},
                "dns": {"nameservers": ["10.96.0.10"]},
                // 0.3's keys are unknown ones here.
                "interfaces": "not read", "ips": 7
            })
            .to_string();
        let view = ResultView::validated(&raw(&text), version)
            .unwrap_or_else(|e| panic!("{version}: {e}"));
        assert_eq!(view.cidrs(), vec!["10.1.0.9/24", "fd00::9/64"]);
        assert_eq!(view.routes.len(), 2);
        assert!(view.interfaces.is_empty());
        // A checkpoint's result reads the same way.
        let stored = ResultView::parse(&raw(
            &text.replace(r#""interfaces":"not read","ips":7"#, r#""y":0"#)
        ))
        .unwrap();
        assert_eq!(stored.cidrs(), view.cidrs());
        assert_eq!(stored.routes.len(), 2);
    }
}

#[test]
fn a_legacy_result_that_does_not_parse_is_code_6() {
    for (text, says) in [
        (
            r#"{"cniVersion":"0.2.0","ip4":"10.0.0.2/24"}"#,
            "prevResult.ip4 is a string, not an object",
        ),
        (
            r#"{"cniVersion":"0.2.0","ip4":{}}"#,
            "prevResult.ip4 has no ip",
        ),
        (
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2"}}"#,
            "prevResult.ip4.ip \"10.0.0.2\" has no prefix length",
        ),
        (
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"fd00::2/64"}}"#,
            "prevResult.ip4.ip fd00::2/64 is not an IPv4 address",
        ),
        (
            r#"{"cniVersion":"0.1.0","ip6":{"ip":"10.0.0.2/24"}}"#,
            "is not an IPv6 address",
        ),
        (
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24","gateway":"ten"}}"#,
            "prevResult.ip4.gateway \"ten\" is not an IP address",
        ),
        (
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24","routes":{}}}"#,
            "prevResult.ip4.routes is an object",
        ),
        (
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24","routes":[{"gw":"10.0.0.1"}]}}"#,
            "prevResult.ip4.routes[0] has no dst",
        ),
        (
            r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24"},"dns":{"nameservers":"x"}}"#,
            "prevResult.dns.nameservers is a string",
        ),
    ] {
        let err = ResultView::validated(&raw(text), "0.2.0").expect_err(text);
        assert_eq!(err.code(), 6, "{text}: {err}");
        assert!(err.msg.contains(says), "{text}: {}", err.msg);
        assert!(
            err.details.contains("must return a valid CNI 0."),
            "{err:?}"
        );
    }
}

#[test]
fn converts_between_0_1_0_and_0_2_0_by_the_version_alone() {
    let text =
        r#"{"cniVersion":"0.1.0","ip4":{"ip":"10.0.0.2/32","x":[1.0e2]},"dns":{},"x-top":true}"#;
    assert_eq!(
        as_version(&raw(text), "0.2.0").unwrap().into_owned(),
        text.replace("0.1.0", "0.2.0")
    );
}

#[test]
fn converts_legacy_up_keeping_unknown_members() {
    let text = r#"{"cniVersion":"0.2.0","x-top":1e400,"ip4":{"ip":"10.0.0.2/24","gateway":"10.0.0.1","x-ip":"k",
            "routes":[{"dst":"0.0.0.0/0","x-route":1}]},"ips":"an unknown key here","dns":{"domain":"d"}}"#;
    let out = as_version(&raw(text), "0.4.0").unwrap().into_owned();
    assert!(out.contains(r#""x-top":1e400"#), "{out}");
    assert_eq!(
        out,
        r#"{"cniVersion":"0.4.0","x-top":1e400,"ips":[{"version":"4","address":"10.0.0.2/24","gateway":"10.0.0.1","x-ip":"k"}],"routes":[{"dst":"0.0.0.0/0","x-route":1}],"dns":{"domain":"d"}}"#
    );
    let out = as_version(&raw(text), "1.1.0").unwrap().into_owned();
    assert!(
        out.contains(r#""ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1","x-ip":"k"}]"#),
        "{out}"
    );
}

#[test]
fn converting_down_needs_an_ip() {
    let err = as_version(
        &raw(r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}]}"#),
        "0.2.0",
    )
    .unwrap_err();
    assert_eq!(err.code(), 6, "{err}");
    assert!(err.msg.contains("no IP address"), "{err}");
    // Below 1.0 an IP without `version` has no family to libcni.
    let err = as_version(
        &raw(r#"{"cniVersion":"0.4.0","ips":[{"address":"10.0.0.2/24"}]}"#),
        "0.1.0",
    )
    .unwrap_err();
    assert_eq!(err.code(), 6, "{err}");
}

#[test]
fn a_result_without_a_version_is_in_the_configs_as_libcni_reads_it() {
    let fixed = |text: &str| {
        versioned_as_libcni_reads_it(raw(text), "0.2.0")
            .get()
            .to_string()
    };
    assert_eq!(
        fixed(r#"{"ip4":{"ip":"10.0.0.2/24"},"x":1e400}"#),
        r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24"},"x":1e400}"#
    );
    assert_eq!(
        fixed(r#"{"cniVersion":"","ip4":{}}"#),
        r#"{"cniVersion":"0.2.0","ip4":{}}"#
    );
    assert_eq!(
        fixed(r#"{"cniVersion":1,"ip4":{}}"#),
        r#"{"cniVersion":"0.2.0","ip4":{}}"#
    );
    // A version it has, even one the guard does not read, is the result's own.
    for kept in [
        r#"{"cniVersion":"0.1.0","ip4":{}}"#,
        r#"{"cniVersion":"9.9.9"}"#,
        "[1]",
        "null",
    ] {
        assert_eq!(fixed(kept), kept);
    }
}

#[test]
fn shown_values_stay_short() {
    assert_eq!(shown("abc"), "\"abc\"");
    assert!(shown(&"\u{1}".repeat(1000)).len() <= 52);
    assert!(shown(&"é".repeat(1000)).ends_with("\"..."));
}
