//! Where each tool a test asks for comes from on a fresh machine. `sys::require` refuses a
//! tool that has no row here, and tests/packages.rs checks every row against what
//! scripts/test.sh installs, so a tool that only the developer's machine happens to have
//! fails the suite there, not on a newcomer's machine.
#![allow(dead_code)]

/// What puts a tool on the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// A Debian package; scripts/test.sh's `need_packages` list must name it.
    Debian(&'static str),
    /// A Debian package of a Python module, asked for by the package's own name.
    DebianPython(&'static str),
    /// PyPI's package of that name, which scripts/test.sh pip-installs in a virtualenv.
    PyPi(&'static str),
    /// Built from the Go module proxy by the script named (scripts/node.sh and its library),
    /// which the real-node tests run before any test that asks for it.
    NodeBuild(&'static str),
    /// The Rust toolchain the suite itself is built with (`need_cargo` checks it).
    RustToolchain,
    /// A path in this repository (tests/vendor's libcni source), there in every clone.
    InRepo(&'static str),
}

/// Every tool a test asks for, by the name it asks for it (a command on PATH, or a path).
pub const PROVIDERS: &[(&str, Provider)] = &[
    ("bash", Provider::Debian("bash")),
    ("base64", Provider::Debian("coreutils")),
    ("basename", Provider::Debian("coreutils")),
    ("cat", Provider::Debian("coreutils")),
    ("touch", Provider::Debian("coreutils")),
    ("truncate", Provider::Debian("coreutils")),
    ("cut", Provider::Debian("coreutils")),
    ("date", Provider::Debian("coreutils")),
    ("dirname", Provider::Debian("coreutils")),
    ("mkdir", Provider::Debian("coreutils")),
    ("readlink", Provider::Debian("coreutils")),
    ("rm", Provider::Debian("coreutils")),
    ("seq", Provider::Debian("coreutils")),
    ("tr", Provider::Debian("coreutils")),
    ("sed", Provider::Debian("sed")),
    ("grep", Provider::Debian("grep")),
    ("cp", Provider::Debian("coreutils")),
    ("paste", Provider::Debian("coreutils")),
    ("sha1sum", Provider::Debian("coreutils")),
    ("sha256sum", Provider::Debian("coreutils")),
    ("sleep", Provider::Debian("coreutils")),
    ("tail", Provider::Debian("coreutils")),
    ("timeout", Provider::Debian("coreutils")),
    ("true", Provider::Debian("coreutils")),
    ("sh", Provider::Debian("dash")),
    ("kill", Provider::Debian("procps")),
    ("sysctl", Provider::Debian("procps")),
    ("tar", Provider::Debian("tar")),
    ("git", Provider::Debian("git")),
    ("mount", Provider::Debian("mount")),
    ("umount", Provider::Debian("mount")),
    ("losetup", Provider::Debian("mount")),
    ("findmnt", Provider::Debian("util-linux")),
    ("flock", Provider::Debian("util-linux")),
    ("setsid", Provider::Debian("util-linux")),
    ("nsenter", Provider::Debian("util-linux")),
    ("unshare", Provider::Debian("util-linux")),
    ("ip", Provider::Debian("iproute2")),
    ("ping", Provider::Debian("iputils-ping")),
    ("tcpdump", Provider::Debian("tcpdump")),
    ("curl", Provider::Debian("curl")),
    ("openssl", Provider::Debian("openssl")),
    ("strace", Provider::Debian("strace")),
    ("readelf", Provider::Debian("binutils")),
    ("mkfs.ext4", Provider::Debian("e2fsprogs")),
    ("mkfs.xfs", Provider::Debian("xfsprogs")),
    ("python3", Provider::Debian("python3-minimal")),
    (
        "python3-prometheus-client",
        Provider::DebianPython("python3-prometheus-client"),
    ),
    ("go", Provider::Debian("golang-go")),
    (
        "/usr/share/gocode/src/github.com/containernetworking/cni/libcni",
        Provider::Debian("golang-github-appc-cni-dev"),
    ),
    (
        "/usr/lib/cni/bridge",
        Provider::Debian("containernetworking-plugins"),
    ),
    (
        "/usr/lib/cni/host-local",
        Provider::Debian("containernetworking-plugins"),
    ),
    (
        "/usr/lib/cni/loopback",
        Provider::Debian("containernetworking-plugins"),
    ),
    (
        "/usr/lib/cni/macvlan",
        Provider::Debian("containernetworking-plugins"),
    ),
    (
        "/usr/lib/cni/portmap",
        Provider::Debian("containernetworking-plugins"),
    ),
    (
        "/usr/lib/cni/tuning",
        Provider::Debian("containernetworking-plugins"),
    ),
    ("containerd", Provider::Debian("containerd")),
    ("containerd-shim-runc-v2", Provider::Debian("containerd")),
    ("ctr", Provider::Debian("containerd")),
    ("runc", Provider::Debian("runc")),
    ("catatonit", Provider::Debian("catatonit")),
    ("/usr/bin/catatonit", Provider::Debian("catatonit")),
    ("protoc", Provider::Debian("protobuf-compiler")),
    ("podman", Provider::Debian("podman")),
    ("conmon", Provider::Debian("conmon")),
    ("docker-registry", Provider::Debian("docker-registry")),
    ("kubernetes-validate", Provider::PyPi("kubernetes-validate")),
    (
        "/var/cache/sg-node/bin/containerd-2.2.9/containerd",
        Provider::NodeBuild("scripts/lib/node-build.sh"),
    ),
    (
        "/var/cache/sg-node/bin/kubernetes-1.37.2/kubectl",
        Provider::NodeBuild("scripts/lib/node-build.sh"),
    ),
    ("cargo", Provider::RustToolchain),
];

/// The row for `tool`, if it has one; a path in this repository is its own.
pub fn provider(tool: &str) -> Option<Provider> {
    const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/");
    if tool.starts_with(REPO) {
        return Some(Provider::InRepo(REPO));
    }
    PROVIDERS
        .iter()
        .find(|(name, _)| *name == tool)
        .map(|&(_, provider)| provider)
}
