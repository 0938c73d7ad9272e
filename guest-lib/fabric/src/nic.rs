//! The NIC a process's domains and passive endpoints share: host attach
//! allows one attachment per node per process, and a passive endpoint
//! (made from the fabric, before any domain) needs the NIC too.

use std::sync::{Arc, Mutex, Weak};

use ulnic::{Error, Nic, ProtectionDomain};

/// An open NIC and the protection domain the provider's endpoints use.
pub struct SharedNic {
    /// The NIC.
    pub nic: Nic,
    /// Its protection domain.
    pub pd: ProtectionDomain,
}

static OPEN: Mutex<Weak<SharedNic>> = Mutex::new(Weak::new());

/// The process's NIC, opened on first use and closed when its last user
/// goes.
pub fn shared() -> Result<Arc<SharedNic>, Error> {
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = open.upgrade() {
        return Ok(n);
    }
    let nic = Nic::open()?;
    let pd = nic.alloc_pd()?;
    let n = Arc::new(SharedNic { nic, pd });
    *open = Arc::downgrade(&n);
    Ok(n)
}
