//! The hosts of a bare-metal cluster, as a runner file's `inventory:` lists them.

use serde::{Deserialize, Serialize};

/// One host of a bare-metal inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Host {
    /// SSH host name.
    pub hostname: String,
    /// GPUs on the host.
    pub gpus: u32,
}

impl Host {
    /// Host `hostname` (SSH host name) with `gpus` GPUs.
    pub fn new(hostname: impl Into<String>, gpus: u32) -> Self {
        Self {
            hostname: hostname.into(),
            gpus,
        }
    }
}

/// The hosts of a `baremetal` runner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BaremetalInventory {
    /// Host of the torchrun rendezvous (must be one of `hosts`).
    pub rendezvous_host: String,
    /// First TCP port for rendezvous; each process group gets its own port from here.
    pub rendezvous_port_base: u16,
    /// The hosts, in placement order.
    pub hosts: Vec<Host>,
}
