//! The changes `--restore` makes, one kernel request each.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use rtnetlink::packet_route::route::RouteScope;
use rtnetlink::{LinkMacVlan, LinkUnspec, LinkVlan, RouteMessageBuilder};

use super::read::{Side, macvlan_mode_from_name};
use super::{Kernel, errno, failed};
use crate::error::{GuardError, Kind, Result};

/// Right after a netns teardown the kernel may still hold the old macvlan's MAC on the
/// parent (the teardown is asynchronous): creating its twin fails with EADDRINUSE until the
/// old one is really gone, which takes milliseconds.
const ADDRESS_IN_USE_PATIENCE: Duration = Duration::from_secs(3);
const ADDRESS_IN_USE_PAUSE: Duration = Duration::from_millis(50);

/// A macvlan to create in the pod's netns.
#[derive(Debug)]
pub struct NewMacvlan<'a> {
    pub name: &'a str,
    pub parent_index: u32,
    pub mode: &'a str,
    pub mac: &'a [u8],
    pub mtu: Option<u32>,
}

impl Kernel {
    pub fn create_vlan(&self, name: &str, lower_index: u32, vlan_id: u16, mtu: Option<u32>) -> Result<()> {
        let mut builder = LinkVlan::new(name, lower_index, vlan_id);
        if let Some(mtu) = mtu {
            builder = builder.mtu(mtu);
        }
        self.block_on(self.host.link().add(builder.build()).execute())
            .map_err(|e| failed(&format!("create vlan {name} (id {vlan_id}) on link #{lower_index}"), e))
    }

    pub fn set_up(&self, side: Side, name: &str) -> Result<()> {
        let handle = match side {
            Side::Host => &self.host,
            Side::Pod => &self.pod,
        };
        let message = LinkUnspec::new_with_name(name).up().build();
        self.block_on(handle.link().set(message).execute()).map_err(|e| failed(&format!("set {name} up"), e))
    }

    /// Creates the macvlan on its host parent straight inside the pod's netns, under its
    /// final name: no temporary name can collide in the host, and an interrupted restore
    /// leaves nothing behind there.
    pub fn create_macvlan_in_pod(&self, link: &NewMacvlan) -> Result<()> {
        let mode = macvlan_mode_from_name(link.mode).ok_or_else(|| {
            GuardError::new(Kind::Netlink, format!("macvlan mode {:?} is not one this plugin can create", link.mode))
        })?;
        let started = Instant::now();
        loop {
            let mut builder = LinkMacVlan::new(link.name, link.parent_index, mode)
                .address(link.mac.to_vec())
                .setns_by_fd(self.pod_netns_fd());
            if let Some(mtu) = link.mtu {
                builder = builder.mtu(mtu);
            }
            match self.block_on(self.host.link().add(builder.build()).execute()) {
                Err(err) if errno(&err) == Some(nix::libc::EADDRINUSE) && started.elapsed() < ADDRESS_IN_USE_PATIENCE => {
                    self.block_on(tokio::time::sleep(ADDRESS_IN_USE_PAUSE));
                }
                outcome => {
                    return outcome.map_err(|e| {
                        failed(&format!("create macvlan {} on link #{} in the pod's netns", link.name, link.parent_index), e)
                    })
                }
            }
        }
    }

    pub fn add_address(&self, index: u32, cidr: IpNetwork) -> Result<()> {
        let request = self.pod.address().add(index, cidr.ip(), cidr.prefix());
        match self.block_on(request.execute()) {
            Err(err) if errno(&err) == Some(nix::libc::EEXIST) => Ok(()),
            outcome => outcome.map_err(|e| failed(&format!("add address {cidr}"), e)),
        }
    }

    pub fn add_route(&self, index: u32, dst: IpNetwork, gateway: Option<IpAddr>, link_scope: bool, metric: Option<u32>) -> Result<()> {
        let mut builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.ip(), dst.prefix())
            .map_err(|e| GuardError::new(Kind::Netlink, format!("route to {dst}: {e}")))?
            .output_interface(index)
            .scope(if link_scope { RouteScope::Link } else { RouteScope::Universe });
        if let Some(gateway) = gateway {
            builder = builder
                .gateway(gateway)
                .map_err(|e| GuardError::new(Kind::Netlink, format!("route to {dst} via {gateway}: {e}")))?;
        }
        if let Some(metric) = metric {
            builder = builder.priority(metric);
        }
        match self.block_on(self.pod.route().add(builder.build()).execute()) {
            // The connected route of an address may already be there: same route, same effect.
            Err(err) if errno(&err) == Some(nix::libc::EEXIST) => Ok(()),
            outcome => outcome.map_err(|e| failed(&format!("add route {dst}"), e)),
        }
    }
}
