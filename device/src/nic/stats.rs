//! Per-endpoint counters (spec §4, GET_STATS), kept apart so every part of
//! the NIC can count without depending on the endpoint.

/// Per-endpoint counters, in the order of `ulnic_abi::STAT_NAMES`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub tx_messages: u64,
    pub tx_bytes: u64,
    pub rx_messages: u64,
    pub rx_bytes: u64,
    pub tx_errors: u64,
    pub returned_no_buffer: u64,
    pub rx_dropped_no_buffer: u64,
    pub rx_rejected: u64,
    pub bad_descriptors: u64,
    pub ring_errors: u64,
    pub events_lost: u64,
    pub notifications: u64,
    pub doorbells: u64,
    pub tripwires_fired: u64,
    pub utlb_hits: u64,
    pub utlb_misses: u64,
    pub utlb_fetch_ns: u64,
}

impl Stats {
    /// The counters in wire order.
    pub fn to_array(&self) -> [u64; ulnic_abi::STAT_NAMES.len()] {
        [
            self.tx_messages,
            self.tx_bytes,
            self.rx_messages,
            self.rx_bytes,
            self.tx_errors,
            self.returned_no_buffer,
            self.rx_dropped_no_buffer,
            self.rx_rejected,
            self.bad_descriptors,
            self.ring_errors,
            self.events_lost,
            self.notifications,
            self.doorbells,
            self.tripwires_fired,
            self.utlb_hits,
            self.utlb_misses,
            self.utlb_fetch_ns,
        ]
    }
}
