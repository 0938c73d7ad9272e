//! The shard's totals (what `ulnic stats` shows as `totals`, spec
//! §10.6.1).

/// Totals across the shard, logged when a frontend disconnects.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    /// Messages delivered.
    pub delivered: u64,
    /// Messages returned to their sender.
    pub returned: u64,
    /// Notifications raised.
    pub notifications: u64,
    /// Close messages delivered.
    pub closes_delivered: u64,
    /// Close messages that could not be delivered (malformed, sender not
    /// bound, receiver gone or its filter refused), or were discarded
    /// because too many waited.
    pub closes_undeliverable: u64,
    /// Messages the fabric gave back and the device put in their sender's
    /// receive queue (spec §10.4).
    pub returned_to_sender: u64,
    /// Messages the fabric gave back that could not be put there (the
    /// sender's endpoint is gone, or too many waited for its buffers);
    /// their TX_ERROR event was posted all the same.
    pub returns_lost: u64,
    /// Kicks that came while the engine slept, served by the node thread
    /// that received them (spec §5.8).
    pub kicks_served_asleep: u64,
    /// Engine wake-ups by the safety net alone (no kick, command, packet
    /// or fabric due time) after which a pass found sends to serve: lost
    /// wake-ups, found late (spec §10.6.1).
    pub found_by_timer: u64,
    /// `SHMEM_MAP` requests sent (device-wide, from `Pio`; 0 in a shard).
    pub pio_maps: u64,
    /// `SHMEM_UNMAP` requests sent, fences included (as `pio_maps`).
    pub pio_unmaps: u64,
    /// PIO commands served (as `pio_maps`).
    pub pio_commands: u64,
}

summable!(Counters {
    delivered,
    returned,
    notifications,
    closes_delivered,
    closes_undeliverable,
    returned_to_sender,
    returns_lost,
    kicks_served_asleep,
    found_by_timer,
    pio_maps,
    pio_unmaps,
    pio_commands
});
