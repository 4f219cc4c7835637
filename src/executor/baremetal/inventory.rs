//! The hosts of a bare-metal cluster, as a runner file's `inventory:` lists them.

use serde::{Deserialize, Serialize};

/// One host of a bare-metal inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// SSH host name.
    pub hostname: String,
    /// GPUs on the host.
    pub gpus: u32,
}

/// The hosts of a `baremetal` runner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaremetalInventory {
    /// Host of the torchrun rendezvous (must be one of `hosts`).
    pub rendezvous_host: String,
    /// First TCP port for rendezvous; each process group gets its own port from here.
    pub rendezvous_port_base: u16,
    /// The hosts, in placement order.
    pub hosts: Vec<Host>,
}
