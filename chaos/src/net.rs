//! Network faults between nodes (issue 43): each node in a network namespace of its own, joined
//! by a veth link to a bridge in a hub namespace, all created here per test and removed when the
//! [`Net`] drops (also on a panic). The addresses (`10.77.0.0/24`) exist only inside those
//! namespaces, so concurrent tests cannot collide on them; the namespaces' names carry the pid
//! and a counter, so they cannot collide either, and the host's own namespace is never touched
//! (every link is created directly inside a namespace of ours).
//!
//! Faults: a node's link down/up; one-way blocks (so asymmetric partitions) and random loss as
//! nftables rules in the sender's namespace (the kernel here has no netem); [`Net::heal`] undoes
//! them all. Delay, duplication and reordering are the user-space relay's ([`crate::relay`]).
//!
//! Needs root (`CAP_SYS_ADMIN`, `CAP_NET_ADMIN`), `ip` (iproute2) and `nft` (nftables):
//! [`Net::unavailable`] says why not, so a test can skip with the reason.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The nodes' subnet. Private to the test's namespaces: the host never routes it.
const SUBNET_PREFIX: [u8; 3] = [10, 77, 0];
const SUBNET_PREFIX_LEN: u8 = 24;
/// The hub's own address on its bridge (relays for the nodes' peer traffic can listen there).
const HUB_HOST: u8 = 254;
/// More nodes than this would run into the hub's address.
pub const NODES_MAX: usize = 200;
/// What namespaces of this harness are called: `<prefix>-<pid>-<counter>-<role>`.
const NS_PREFIX: &str = "sluice";
/// Loss is given in per mille (nftables draws `numgen random mod 1000`).
pub const LOSS_PER_MILLE_MAX: u32 = 1000;
/// The nftables table and chain each node's namespace gets; its rules are the current faults.
const NFT_TABLE: &str = "sluice_chaos";
const NFT_CHAIN: &str = "out";
/// The node's end of its link, inside its own namespace.
const NODE_IF: &str = "eth0";
const BRIDGE_IF: &str = "br0";

static NETS_CREATED: AtomicU32 = AtomicU32::new(0);

/// What building or changing the network can fail with.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("network faults unavailable: {0}")]
    Unavailable(String),
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid: {0}")]
    Invalid(String),
}

/// One node's namespace and address.
#[derive(Debug, Clone)]
pub struct NetNode {
    pub index: usize,
    /// The namespace's name (`ip netns` lists it; `/run/netns/<ns>`).
    pub ns: String,
    pub addr: Ipv4Addr,
}

impl NetNode {
    /// A command that runs in this node's namespace (it joins it between fork and exec, so the
    /// child is the program itself: its pid is the one to kill or SIGSTOP).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command, NetError> {
        ns_command(&self.ns, program)
    }

    /// Runs `f` on a thread inside this node's namespace and returns its result. Sockets `f`
    /// creates stay in the namespace whichever thread uses them later, and threads `f` spawns
    /// start in it, so a relay or a test client can be built here and driven from anywhere.
    pub fn enter<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, NetError> {
        enter_ns(&self.ns, f)
    }
}

/// Which faults are on, so that [`Net::heal`] and every change rewrite the rules whole.
#[derive(Debug, Default, Clone)]
struct Faults {
    /// (from, to): packets from `from` to `to` are dropped.
    blocked: BTreeMap<(usize, usize), ()>,
    /// (from, to) -> per mille of packets from `from` to `to` dropped at random.
    loss: BTreeMap<(usize, usize), u32>,
    /// Nodes whose link is down.
    down: BTreeMap<usize, ()>,
}

/// N nodes, each in its own namespace, on one bridge in a hub namespace. Dropping it removes
/// every namespace (and with them the links and rules).
pub struct Net {
    hub: String,
    nodes: Vec<NetNode>,
    faults: Faults,
}

impl Net {
    /// Why network faults cannot run here (not root, no `ip`, no `nft`), or `None` if they can.
    pub fn unavailable() -> Option<String> {
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Some("not root (namespaces and nftables need CAP_SYS_ADMIN)".into());
        }
        for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
            let found = Command::new(tool)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !found {
                return Some(format!(
                    "`{tool}` not found (Debian package {package}; ci/install-deps.sh installs it)"
                ));
            }
        }
        None
    }

    /// Builds `nodes` namespaces joined to a bridge, addresses `10.77.0.1..=nodes`, every link
    /// up and no fault. Namespaces a killed earlier run of a dead process left are removed first.
    pub fn new(nodes: usize) -> Result<Net, NetError> {
        if let Some(why) = Net::unavailable() {
            return Err(NetError::Unavailable(why));
        }
        if nodes == 0 || nodes > NODES_MAX {
            return Err(NetError::Invalid(format!(
                "{nodes} nodes (1..={NODES_MAX})"
            )));
        }
        sweep_stale();
        let base = format!(
            "{NS_PREFIX}-{}-{}",
            std::process::id(),
            NETS_CREATED.fetch_add(1, Ordering::Relaxed)
        );
        // From here on `net` owns what exists, so a failure half-way still removes it.
        let mut net = Net {
            hub: format!("{base}-hub"),
            nodes: Vec::with_capacity(nodes),
            faults: Faults::default(),
        };
        run(Command::new("ip").args(["netns", "add", &net.hub]))?;
        let hub = net.hub.clone();
        ip_in(&hub, &["link", "set", "lo", "up"])?;
        ip_in(&hub, &["link", "add", BRIDGE_IF, "type", "bridge"])?;
        ip_in(&hub, &["addr", "add", &cidr(HUB_HOST), "dev", BRIDGE_IF])?;
        ip_in(&hub, &["link", "set", BRIDGE_IF, "up"])?;
        for index in 0..nodes {
            let host = u8::try_from(index + 1).map_err(|_| NetError::Invalid("index".into()))?;
            let node = NetNode {
                index,
                ns: format!("{base}-n{index}"),
                addr: Ipv4Addr::new(SUBNET_PREFIX[0], SUBNET_PREFIX[1], SUBNET_PREFIX[2], host),
            };
            run(Command::new("ip").args(["netns", "add", &node.ns]))?;
            net.nodes.push(node.clone());
            let hub_end = format!("v{index}");
            // Created inside the hub, its peer straight into the node's namespace: the host's
            // namespace never sees either end (so no name there can clash).
            ip_in(
                &hub,
                &[
                    "link", "add", &hub_end, "type", "veth", "peer", "name", NODE_IF, "netns",
                    &node.ns,
                ],
            )?;
            ip_in(&hub, &["link", "set", &hub_end, "master", BRIDGE_IF])?;
            ip_in(&hub, &["link", "set", &hub_end, "up"])?;
            ip_in(&node.ns, &["link", "set", "lo", "up"])?;
            ip_in(&node.ns, &["addr", "add", &cidr(host), "dev", NODE_IF])?;
            ip_in(&node.ns, &["link", "set", NODE_IF, "up"])?;
        }
        net.apply()?;
        Ok(net)
    }

    pub fn nodes(&self) -> &[NetNode] {
        &self.nodes
    }

    pub fn node(&self, index: usize) -> &NetNode {
        &self.nodes[index]
    }

    /// The hub's namespace: on the bridge with every node, at [`Net::hub_addr`].
    pub fn hub_ns(&self) -> &str {
        &self.hub
    }

    pub fn hub_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(
            SUBNET_PREFIX[0],
            SUBNET_PREFIX[1],
            SUBNET_PREFIX[2],
            HUB_HOST,
        )
    }

    /// Runs `f` on a thread inside the hub's namespace (see [`NetNode::enter`]).
    pub fn enter_hub<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, NetError> {
        enter_ns(&self.hub, f)
    }

    fn check(&self, index: usize) -> Result<(), NetError> {
        if index < self.nodes.len() {
            Ok(())
        } else {
            Err(NetError::Invalid(format!(
                "node {index} of {}",
                self.nodes.len()
            )))
        }
    }

    /// Takes node `index`'s link down: it can reach nobody and nobody it (a cable pulled).
    pub fn link_down(&mut self, index: usize) -> Result<(), NetError> {
        self.check(index)?;
        ip_in(&self.nodes[index].ns, &["link", "set", NODE_IF, "down"])?;
        self.faults.down.insert(index, ());
        Ok(())
    }

    /// Brings node `index`'s link back up (its address and routes come back with it).
    pub fn link_up(&mut self, index: usize) -> Result<(), NetError> {
        self.check(index)?;
        ip_in(&self.nodes[index].ns, &["link", "set", NODE_IF, "up"])?;
        self.faults.down.remove(&index);
        Ok(())
    }

    /// Drops every packet from `from` to `to` (one way: `to` may still reach `from`, which is how
    /// an asymmetric partition looks).
    pub fn block(&mut self, from: usize, to: usize) -> Result<(), NetError> {
        self.check(from)?;
        self.check(to)?;
        self.faults.blocked.insert((from, to), ());
        self.apply()
    }

    /// Lets `from` reach `to` again (undoes [`Net::block`]).
    pub fn unblock(&mut self, from: usize, to: usize) -> Result<(), NetError> {
        self.faults.blocked.remove(&(from, to));
        self.apply()
    }

    /// Cuts every link between side `a` and side `b`, both ways.
    pub fn partition(&mut self, a: &[usize], b: &[usize]) -> Result<(), NetError> {
        for &x in a {
            for &y in b {
                self.check(x)?;
                self.check(y)?;
                self.faults.blocked.insert((x, y), ());
                self.faults.blocked.insert((y, x), ());
            }
        }
        self.apply()
    }

    /// Node `index` can reach no other node and none reaches it (its link stays up, unlike
    /// [`Net::link_down`]: the node itself sees no error, only silence).
    pub fn isolate(&mut self, index: usize) -> Result<(), NetError> {
        let others: Vec<usize> = (0..self.nodes.len()).filter(|&i| i != index).collect();
        self.partition(&[index], &others)
    }

    /// Drops `per_mille` of the packets from `from` to `to` at random (the kernel's random
    /// numbers: not replayed by a seed — the relay's loss is, see [`crate::relay`]). 0 clears it.
    pub fn loss(&mut self, from: usize, to: usize, per_mille: u32) -> Result<(), NetError> {
        self.check(from)?;
        self.check(to)?;
        if per_mille > LOSS_PER_MILLE_MAX {
            return Err(NetError::Invalid(format!(
                "loss {per_mille} per mille (at most {LOSS_PER_MILLE_MAX})"
            )));
        }
        if per_mille == 0 {
            self.faults.loss.remove(&(from, to));
        } else {
            self.faults.loss.insert((from, to), per_mille);
        }
        self.apply()
    }

    /// Every fault undone: links up, no blocks, no loss.
    pub fn heal(&mut self) -> Result<(), NetError> {
        let down: Vec<usize> = self.faults.down.keys().copied().collect();
        for index in down {
            self.link_up(index)?;
        }
        self.faults.blocked.clear();
        self.faults.loss.clear();
        self.apply()
    }

    /// The nftables rules in force in node `index`'s namespace (for reports and failing tests).
    pub fn rules(&self, index: usize) -> Result<String, NetError> {
        self.check(index)?;
        let out = run(ns_command(&self.nodes[index].ns, "nft")?
            .args(["list", "chain", "inet", NFT_TABLE, NFT_CHAIN]))?;
        Ok(out)
    }

    /// Rewrites each node's chain from `self.faults`, each in one nftables transaction (the
    /// table is created, flushed and filled atomically: no moment without the old or new rules).
    fn apply(&self) -> Result<(), NetError> {
        for node in &self.nodes {
            let mut script = format!(
                "table inet {NFT_TABLE} {{\n  chain {NFT_CHAIN} {{\n    type filter hook output \
                 priority 0; policy accept;\n  }}\n}}\nflush chain inet {NFT_TABLE} {NFT_CHAIN}\n"
            );
            for &(from, to) in self.faults.blocked.keys() {
                if from == node.index {
                    script.push_str(&format!(
                        "add rule inet {NFT_TABLE} {NFT_CHAIN} ip daddr {} drop\n",
                        self.nodes[to].addr
                    ));
                }
            }
            for (&(from, to), &per_mille) in &self.faults.loss {
                if from == node.index {
                    script.push_str(&format!(
                        "add rule inet {NFT_TABLE} {NFT_CHAIN} ip daddr {} numgen random mod \
                         {LOSS_PER_MILLE_MAX} < {per_mille} drop\n",
                        self.nodes[to].addr
                    ));
                }
            }
            let mut cmd = ns_command(&node.ns, "nft")?;
            cmd.args(["-f", "-"]);
            run_with_stdin(&mut cmd, &script)?;
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes its links (a veth pair goes with either end) and rules.
        for node in &self.nodes {
            let _ = run(Command::new("ip").args(["netns", "del", &node.ns]));
        }
        let _ = run(Command::new("ip").args(["netns", "del", &self.hub]));
    }
}

/// Removes namespaces of this harness whose process is gone (a run killed with SIGKILL cannot
/// drop its [`Net`]). Namespaces of live processes, ours included, are left alone.
pub fn sweep_stale() {
    let Ok(out) = run(Command::new("ip").args(["netns", "list"])) else {
        return;
    };
    for line in out.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = stale_owner(name) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(Command::new("ip").args(["netns", "del", name]));
        }
    }
}

/// The pid in a namespace name of ours (`sluice-<pid>-<counter>-<role>`).
fn stale_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NS_PREFIX)?.strip_prefix('-')?;
    let mut parts = rest.split('-');
    let pid = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u32>().ok()?;
    parts.next()?;
    Some(pid)
}

fn cidr(host: u8) -> String {
    format!(
        "{}.{}.{}.{host}/{SUBNET_PREFIX_LEN}",
        SUBNET_PREFIX[0], SUBNET_PREFIX[1], SUBNET_PREFIX[2]
    )
}

fn ns_file(ns: &str) -> Result<File, NetError> {
    File::open(format!("/run/netns/{ns}"))
        .map_err(|e| NetError::Invalid(format!("namespace {ns}: {e}")))
}

fn ns_command(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Result<Command, NetError> {
    let file = ns_file(ns)?;
    let mut cmd = Command::new(program);
    // SAFETY: setns(2) is a plain system call (async-signal-safe), run between fork and exec on
    // a descriptor the closure owns (`file` is moved in and outlives the call); it changes only
    // the child's own namespace.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

fn enter_ns<R: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, NetError> {
    let file = ns_file(ns)?;
    let ns = ns.to_string();
    let handle = std::thread::spawn(move || {
        // SAFETY: setns(2) on an open namespace descriptor; it moves only this new thread
        // (a network namespace is per thread), which ends when `f` returns.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(f())
    });
    match handle.join() {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(NetError::Invalid(format!("entering {ns}: {e}"))),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn ip_in(ns: &str, args: &[&str]) -> Result<String, NetError> {
    run(Command::new("ip").arg("-n").arg(ns).args(args))
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn run(cmd: &mut Command) -> Result<String, NetError> {
    let out = cmd.stdin(Stdio::null()).output()?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NetError::Command {
            command: describe(cmd),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn run_with_stdin(cmd: &mut Command, input: &str) -> Result<String, NetError> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NetError::Command {
            command: format!("{} <<< {input}", describe(cmd)),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_of_this_harness_are_swept() {
        assert_eq!(stale_owner("sluice-1234-0-hub"), Some(1234));
        assert_eq!(stale_owner("sluice-1234-7-n2"), Some(1234));
        assert_eq!(stale_owner("sluice-x-0-hub"), None);
        assert_eq!(stale_owner("sluice-1234"), None);
        assert_eq!(stale_owner("other-1234-0-hub"), None);
    }
}
