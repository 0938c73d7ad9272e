//! What the library parses from shared memory (spec §5): receive
//! descriptors, events, cookies, device information, free and send
//! descriptors. Any bytes decode without panicking, and what is encoded
//! decodes to the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ulnic_abi::{Cookie, DeviceInfo, EventRecord, FreeDesc, RecvDesc, SendDesc};

fuzz_target!(|data: &[u8]| {
    let mut b = [0u8; 128];
    b[..data.len().min(128)].copy_from_slice(&data[..data.len().min(128)]);
    let _ = RecvDesc::decode(&b);
    let s = SendDesc::decode(&b);
    let mut again = [0u8; 128];
    s.encode_header(&mut again);
    assert_eq!(SendDesc::decode(&again).len, s.len);
    let e = EventRecord::decode(&b[..32]);
    let mut eb = [0u8; 32];
    e.encode(&mut eb);
    assert_eq!(EventRecord::decode(&eb), e);
    let _ = FreeDesc::decode(&b[..32]);
    let c = Cookie::decode(&b[..Cookie::SIZE]);
    assert_eq!(Cookie::decode(&c.encode()), c);
    let i = DeviceInfo::decode(&b[..DeviceInfo::SIZE]);
    assert_eq!(DeviceInfo::decode(&i.encode()), i);
});
