//! Where the library finds its device: environment variables and defaults.

/// Environment variable naming the device node socket to attach to.
pub const SOCKET_ENV: &str = "ULNIC_SOCKET";
/// Environment variable naming the guest device file (default `/dev/ulnic0`).
pub const DEVICE_ENV: &str = "ULNIC_DEVICE";
/// The first guest device file.
pub const DEFAULT_DEVICE: &str = "/dev/ulnic0";
/// Environment variable giving the shared-memory size for host attach (bytes).
pub const MEMORY_ENV: &str = "ULNIC_MEMORY";
