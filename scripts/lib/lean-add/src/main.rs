//! A lean ADD, for scripts/bench.sh: the guard's kernel work (the pod's netns entered for a
//! netlink socket, the link, its addresses and routes and its host-side peer asked for, the
//! store's lock, the record as a symlink where the file system keeps its compacted text (the
//! guard's own `entry_text`) as a target, else
//! an O_TMPFILE linked into `records/` and fdatasynced, the owner and address-index symlinks,
//! one directory fsync, the result written) plus the least
//! user-space work a durable ADD needs: the config and its prevResult parsed with serde_json,
//! three texts serialised and sealed with sha256 as the store seals them, of the sizes the
//! guard writes for the bench's pod. Built as the guard is (static, LTO, the same C `main`
//! without std's start-up). It checks nothing, looks nothing up and keeps no generation: what
//! it costs above the kernel work is what parsing and sealing cost, so what the guard costs
//! above it is the guard's own logic.
//!
//!   lean-add < config     (CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS as for ADD)
//!
//! `LEAN_ADD_WRITES=record` leaves out the owner and the address entry: what a durable ADD that
//! reads the link facts costs with the least a store can write, one file.
#![no_main]

use std::ffi::CString;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

#[allow(dead_code)]
#[path = "../../../../src/state/entry_text.rs"]
mod entry_text;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf<'a> {
    cni_version: String,
    name: String,
    state_dir: String,
    #[serde(borrow)]
    prev_result: &'a RawValue,
}

/// The guard's record for the bench's pod, field for field; the link facts and the identity
/// as the texts the guard writes for it (`LINKS`, `IDENTITY`), so that compacted it is the
/// guard's size too.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Record<'a> {
    network: &'a str,
    container_id: &'a str,
    if_name: &'a str,
    pod_namespace: &'a str,
    pod_name: &'a str,
    pod_uid: &'a str,
    infra_container_id: &'a str,
    netns: &'a str,
    cni_version: &'a str,
    generation: u64,
    created_at: &'a str,
    updated_at: &'a str,
    prev_result: &'a RawValue,
    links: &'a RawValue,
    identity: &'a RawValue,
}

/// What the guard records of the bench pod's link and its netns.
const LINKS: &str = r#"{"state":"observed","name":"eth0","kind":"veth","mtu":1500,"mac":"2e:2b:e2:bc:06:ec","addresses":["10.0.0.5/8"],"routes":[],"parent":{"name":"flrh","index":7502,"kind":"veth","mtu":1500},"settings":{"ipv4":{"forwarding":1}}}"#;
const IDENTITY: &str =
    r#"{"netnsDev":4,"netnsInode":4026532178,"netnsCookie":18226,"ifIndex":2,"ifKind":"veth"}"#;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Owner<'a> {
    network: &'a str,
    pod_namespace: &'a str,
    pod_name: &'a str,
    container_id: &'a str,
    pod_uid: &'a str,
    generation: u64,
    interfaces: [&'a str; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IpHolder<'a> {
    network: &'a str,
    address: &'a str,
    container_id: &'a str,
    if_name: &'a str,
    pod_namespace: &'a str,
    pod_name: &'a str,
    netns: &'a str,
    netns_inode: u64,
    since: &'a str,
}

fn seal<T: Serialize>(value: &T) -> CString {
    let record = serde_json::to_vec(value).expect("serialisable");
    let mut out = Vec::with_capacity(record.len() + 96);
    out.extend_from_slice(b"{\"checksum\":\"sha256:");
    for byte in Sha256::digest(&record) {
        out.extend_from_slice(format!("{byte:02x}").as_bytes());
    }
    out.extend_from_slice(b"\",\"record\":");
    out.extend_from_slice(&record);
    out.push(b'}');
    CString::new(out).expect("no NUL in JSON")
}

fn c(text: &str) -> CString {
    CString::new(text).expect("no NUL")
}

fn check(ok: bool, what: &str) {
    if !ok {
        eprintln!("lean-add: {what}: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
}

/// One rtnetlink request on `sock`, its answers read to the end; returns the IFLA_LINK of the
/// first link answered.
fn ask(sock: i32, kind: u16, dump: bool, index: i32, name: Option<&str>, buf: &mut [u8]) -> i32 {
    let mut req = [0u8; 96];
    let mut len = 32; // nlmsghdr + ifinfomsg (also long enough for ifaddrmsg and rtmsg)
    let mut attr = |req: &mut [u8; 96], kind: u16, value: &[u8]| {
        let alen = 4 + value.len();
        req[len..len + 2].copy_from_slice(&(alen as u16).to_ne_bytes());
        req[len + 2..len + 4].copy_from_slice(&kind.to_ne_bytes());
        req[len + 4..len + alen].copy_from_slice(value);
        len += (alen + 3) & !3;
    };
    if let Some(name) = name {
        attr(&mut req, libc::IFLA_IFNAME, format!("{name}\0").as_bytes());
    }
    if kind == libc::RTM_GETLINK {
        attr(
            &mut req,
            libc::IFLA_EXT_MASK,
            &libc::RTEXT_FILTER_SKIP_STATS.to_ne_bytes(),
        );
        req[20..24].copy_from_slice(&index.to_ne_bytes());
    }
    req[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&kind.to_ne_bytes());
    let flags = libc::NLM_F_REQUEST | if dump { libc::NLM_F_DUMP } else { 0 };
    req[6..8].copy_from_slice(&(flags as u16).to_ne_bytes());
    // SAFETY: send and recv on a socket this program owns, with buffers of the lengths given.
    check(
        unsafe { libc::send(sock, req.as_ptr().cast(), len, 0) } == len as isize,
        "send",
    );
    let mut peer = 0;
    loop {
        let got = unsafe { libc::recv(sock, buf.as_mut_ptr().cast(), buf.len(), 0) };
        check(got > 0, "recv");
        let (got, mut at) = (got as usize, 0);
        let field = |at: usize| u16::from_ne_bytes([buf[at], buf[at + 1]]);
        while at + 16 <= got {
            let mlen = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            let (mtype, mflags) = (field(at + 4), field(at + 6));
            if mtype == libc::NLMSG_ERROR as u16 {
                let code = buf
                    .get(at + 16..at + 20)
                    .map_or(-1, |b| i32::from_ne_bytes(b.try_into().unwrap()));
                check(code == 0, "the kernel refused a request");
                return peer;
            }
            if mtype == libc::NLMSG_DONE as u16 {
                return peer;
            }
            if mtype == libc::RTM_NEWLINK && peer == 0 {
                let mut a = at + 32;
                while a + 8 <= at + mlen {
                    let alen = field(a) as usize;
                    if field(a + 2) == libc::IFLA_LINK {
                        peer = i32::from_ne_bytes(buf[a + 4..a + 8].try_into().unwrap());
                    }
                    a += (alen.max(4) + 3) & !3;
                }
            }
            if mflags & libc::NLM_F_MULTI as u16 == 0 {
                return peer;
            }
            at += (mlen.max(16) + 3) & !3;
        }
    }
}

#[unsafe(no_mangle)]
extern "C" fn main(_argc: i32, _argv: *const *const u8) -> i32 {
    // SAFETY: what the guard's own entry does before anything else.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let mut input = Vec::new();
    check(
        std::io::stdin().read_to_end(&mut input).is_ok(),
        "read stdin",
    );
    let conf: Conf = serde_json::from_slice(&input).expect("a config");
    let prev: serde_json::Value = serde_json::from_str(conf.prev_result.get()).expect("a result");
    let address = prev["ips"][0]["address"]
        .as_str()
        .unwrap_or("")
        .split('/')
        .next()
        .unwrap_or("");
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    let (cid, netns, ifname, args) = (
        env("CNI_CONTAINERID"),
        env("CNI_NETNS"),
        env("CNI_IFNAME"),
        env("CNI_ARGS"),
    );
    let arg = |key: &str| {
        args.split(';')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or("")
    };
    let (pod_namespace, pod_name, pod_uid) = (
        arg("K8S_POD_NAMESPACE"),
        arg("K8S_POD_NAME"),
        arg("K8S_POD_UID"),
    );

    let mut buf = vec![0u8; 32768];
    // SAFETY: system calls on paths and fds this program owns.
    unsafe {
        let flags = libc::O_RDONLY | libc::O_CLOEXEC;
        let pod = libc::open(c(&netns).as_ptr(), flags);
        let home = libc::open(c("/proc/thread-self/ns/net").as_ptr(), flags);
        let socket = || {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        let host = socket();
        check(
            pod >= 0 && home >= 0 && host >= 0 && libc::setns(pod, libc::CLONE_NEWNET) == 0,
            "enter the netns",
        );
        let inside = socket();
        check(
            inside >= 0 && libc::setns(home, libc::CLONE_NEWNET) == 0,
            "leave the netns",
        );
        let peer = ask(inside, libc::RTM_GETLINK, false, 0, Some(&ifname), &mut buf);
        ask(inside, libc::RTM_GETADDR, true, 0, None, &mut buf);
        ask(inside, libc::RTM_GETROUTE, true, 0, None, &mut buf);
        ask(
            host,
            libc::RTM_GETLINK,
            false,
            if peer > 0 { peer } else { 1 },
            None,
            &mut buf,
        );
        for fd in [inside, host, home, pod] {
            libc::close(fd);
        }
    }

    let now = "2026-01-01T00:00:00Z";
    let links: &RawValue = serde_json::from_str(LINKS).expect("JSON");
    let identity: &RawValue = serde_json::from_str(IDENTITY).expect("JSON");
    let record = seal(&Record {
        network: &conf.name,
        container_id: &cid,
        if_name: &ifname,
        pod_namespace,
        pod_name,
        pod_uid,
        infra_container_id: &cid,
        netns: &netns,
        cni_version: &conf.cni_version,
        generation: 1,
        created_at: now,
        updated_at: now,
        prev_result: conf.prev_result,
        links,
        identity,
    });
    let owner = seal(&Owner {
        network: &conf.name,
        pod_namespace,
        pod_name,
        container_id: &cid,
        pod_uid,
        generation: 1,
        interfaces: [&ifname],
    });
    let holder = seal(&IpHolder {
        network: &conf.name,
        address,
        container_id: &cid,
        if_name: &ifname,
        pod_namespace,
        pod_name,
        netns: &netns,
        netns_inode: 4026532178,
        since: now,
    });
    let key: String = Sha256::digest(format!("{}\0{pod_namespace}\0{pod_name}", conf.name))
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();

    let state = &conf.state_dir;
    // SAFETY: system calls on paths and fds this program owns, with buffers of the lengths given.
    unsafe {
        let lock = libc::open(
            c(&format!("{state}/lock")).as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        );
        check(lock >= 0 && libc::flock(lock, libc::LOCK_EX) == 0, "lock");
        let name = c(&format!("{state}/records/{}:{cid}:{ifname}", conf.name));
        let mut file = -1;
        let entry = entry_text::compact(record.as_bytes()).and_then(|text| CString::new(text).ok());
        let entry = entry.expect("JSON compacts");
        if libc::symlink(entry.as_ptr(), name.as_ptr()) != 0 {
            check(
                std::io::Error::last_os_error().raw_os_error() == Some(libc::ENAMETOOLONG),
                "record",
            );
            file = libc::open(
                c(&format!("{state}/records")).as_ptr(),
                libc::O_WRONLY | libc::O_TMPFILE | libc::O_CLOEXEC,
                0o600,
            );
            let text = record.as_bytes();
            check(
                file >= 0
                    && libc::write(file, text.as_ptr().cast(), text.len()) == text.len() as isize,
                "write",
            );
            check(
                libc::linkat(
                    file,
                    c("").as_ptr(),
                    libc::AT_FDCWD,
                    name.as_ptr(),
                    libc::AT_EMPTY_PATH,
                ) == 0,
                "link",
            );
        }
        let whole = std::env::var_os("LEAN_ADD_WRITES").is_none_or(|writes| writes != "record");
        if whole {
            check(
                libc::symlink(owner.as_ptr(), c(&format!("{state}/owners/{key}")).as_ptr()) == 0,
                "owner",
            );
            // The guard's DEL leaves the address entry, and its next ADD of the address replaces it.
            let entry = c(&format!("{state}/ips/{}:{address}", conf.name));
            libc::unlink(entry.as_ptr());
            check(
                libc::symlink(holder.as_ptr(), entry.as_ptr()) == 0,
                "address entry",
            );
        }
        check(file < 0 || libc::fdatasync(file) == 0, "fdatasync");
        // The directory changed last, as the guard's sync takes it.
        let changed_last = if whole { "owners" } else { "records" };
        let dir = libc::open(
            c(&format!("{state}/{changed_last}")).as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        check(dir >= 0 && libc::fsync(dir) == 0, "fsync");
        for fd in [dir, file, lock] {
            libc::close(fd);
        }
    }
    // Flushed here: returning from a C `main` skips std's flush at exit.
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_all(conf.prev_result.get().as_bytes())
        .and_then(|()| stdout.flush());
    check(written.is_ok(), "write the result");
    0
}
