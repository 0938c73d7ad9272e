//! docs/spec.md, section by section, checked through a frontend written
//! from the spec (device/tests/common/spec.rs): raw vhost-user messages,
//! rings laid out by hand in a memfd, commands and descriptors encoded with
//! the contract's wire structs. Each test is named after the section it
//! checks; a disagreement between the spec and the device shows up here
//! first (issue 32). This file walks §2 (transport, queues, config space,
//! shared memory, bring-up, restart); conformance_control.rs walks §3-§4,
//! conformance_messages.rs §5.1-§5.11 and §7, conformance_remote.rs
//! §5.12-§5.13, §6 and §8.
use ulnic_testkit as common;
#[path = "common/spec.rs"]
mod spec;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::Duration;

use spec::{
    desc, node_state, protocol_bit, protocols, raw_message, released, send_inline, send_segment,
    Raw, Sharing, COMMANDS, F_NEXT, F_WRITE, PROTOCOL_FEATURES, QUEUE, RESP, VERSION_1,
};
use ulnic_abi::wire::{CmdHeader, CreatePd, DeviceInfo, Export, ObjectId, RdmaDesc, RedirectDesc};
use ulnic_abi::{
    cmd, event, op, perm, recv_flags, send_flags, status, tx_error, CONFIG_MAGIC, F_CLOSE_MESSAGE,
    F_IMPLEMENTED, F_MESSAGING, F_OOB, F_RDMA, F_TRIPWIRE, F_UTLB, SPEC_VERSION_MAJOR,
    SPEC_VERSION_MINOR,
};
use vhost::vhost_user::message::{FrontendReq, VhostUserVringState};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VringConfigData};
use virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT;
use vm_memory::ByteValued;
use vmm_sys_util::eventfd::EventFd;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// An EXPORT of the first page of `ep`'s segment, read and write.
fn export_payload(ep: &spec::Ep) -> Export {
    Export {
        endpoint: ep.id.into(),
        perms: perm::ALL.into(),
        offset: 0.into(),
        len: 4096.into(),
    }
}

/// §2: the virtio feature bits offered are VERSION_1 (32), vhost-user's
/// PROTOCOL_FEATURES (30) and the device bits of §2's table marked
/// implemented: 0-7.
#[test]
fn s2_features_offered_are_version_1_protocol_features_and_the_device_bits() {
    let dev = common::device(1);
    let fe = Frontend::connect(common::socket(&dev, 0), 64).unwrap();
    let offered = fe.get_features().unwrap();
    let device_bits = 0b1111_1111;
    assert_eq!(
        F_IMPLEMENTED, device_bits,
        "the contract's implemented bits"
    );
    assert_eq!(F_OOB, 1 << 5);
    assert_eq!(protocol_bit(), PROTOCOL_FEATURES);
    assert_eq!(offered, VERSION_1 | PROTOCOL_FEATURES | device_bits);
}

/// §2: the protocol features offered are exactly MQ, CONFIG, REPLY_ACK
/// and PIO's BACKEND_REQ, BACKEND_SEND_FD and SHMEM (not RESET_DEVICE,
/// not CONFIGURE_MEM_SLOTS); §2.4 step 3: GET_QUEUE_NUM gives 64.
#[test]
fn s2_protocol_features_offered_are_mq_config_reply_ack_and_pios() {
    let dev = common::device(1);
    let mut fe = Frontend::connect(common::socket(&dev, 0), 64).unwrap();
    fe.get_features().unwrap();
    fe.set_owner().unwrap();
    fe.set_features(VERSION_1 | PROTOCOL_FEATURES | F_MESSAGING)
        .unwrap();
    assert_eq!(fe.get_protocol_features().unwrap(), protocols());
    fe.set_protocol_features(protocols()).unwrap();
    assert_eq!(fe.get_queue_num().unwrap(), 64);
}

/// §2: a command of a feature not accepted answers NOT_SUPPORTED, each
/// command needing the features §4.2's table names (GET_INFO none); with
/// no device bit accepted every command but GET_INFO does.
#[test]
fn s2_a_command_of_a_feature_not_accepted_answers_not_supported() {
    let dev = common::device(1);
    let sock = common::socket(&dev, 0);
    let sets = [
        0,
        F_MESSAGING,
        F_MESSAGING | F_UTLB,
        F_MESSAGING | F_RDMA,
        F_MESSAGING | F_RDMA | F_TRIPWIRE,
        F_IMPLEMENTED,
    ];
    for accepted in sets {
        let mut raw = Raw::with_features(&sock, accepted);
        for (opcode, len, _, needs) in COMMANDS {
            let got = raw.command(opcode, &vec![0; len]).0;
            if needs & !accepted != 0 {
                assert_eq!(got, status::NOT_SUPPORTED, "{opcode:#x} with {accepted:#x}");
            } else {
                assert_ne!(got, status::NOT_SUPPORTED, "{opcode:#x} with {accepted:#x}");
            }
        }
        drop(raw);
        released(&dev, 0);
    }
}

/// §2 and §5.9: a send-ring descriptor using a feature not accepted fails
/// with BAD_DESCRIPTOR (RDMA opcodes need F_RDMA, the UTLB flag F_UTLB,
/// REDIRECT both); the same descriptors fail otherwise once the features
/// are accepted.
#[test]
fn s2_a_descriptor_of_a_feature_not_accepted_is_a_bad_descriptor() {
    let dev = common::device(1);
    let sock = common::socket(&dev, 0);
    let mut rdma = RdmaDesc::new_zeroed();
    rdma.opcode = op::RDMA_WRITE.into();
    rdma.len = 8.into();
    rdma.cookie_aperture = 5.into();
    rdma.user_id = 1.into();
    let mut utlb = send_segment((0, 9), 0, 2, 0, 8);
    utlb.flags = send_flags::UTLB.into();
    let mut redirect = RedirectDesc::new_zeroed();
    redirect.opcode = op::REDIRECT.into();
    redirect.flags = send_flags::UTLB.into();
    redirect.len = 8.into();
    redirect.aperture = 63.into();
    redirect.id = 3.into();
    let (error, refused) = (event::TX_ERROR, event::REDIRECTED);
    let bad = (error, tx_error::BAD_DESCRIPTOR);
    let cases = [
        (F_MESSAGING, [bad, bad, bad]),
        (
            F_MESSAGING | F_RDMA,
            [(error, tx_error::BAD_COOKIE), bad, bad],
        ),
        (
            F_IMPLEMENTED,
            [
                (error, tx_error::BAD_COOKIE),
                (error, tx_error::NO_TRANSLATION),
                (refused, ulnic_abi::redirect::REFUSED),
            ],
        ),
    ];
    for (accepted, want) in cases {
        let mut raw = Raw::with_features(&sock, accepted);
        let mut ep = raw.bound(9);
        raw.post(&mut ep, &rdma);
        raw.post(&mut ep, &utlb);
        raw.post(&mut ep, &redirect);
        for (i, want) in want.iter().enumerate() {
            let e = raw.event(&mut ep);
            let got = ((e.kind.get(), e.code.get()), e.user_id.get());
            assert_eq!(got, (*want, i as u64 + 1), "{accepted:#x}: descriptor {i}");
        }
        drop(raw);
        released(&dev, 0);
    }
}

/// §2: no close message is sent without F_CLOSE_MESSAGE accepted (and one
/// is, with it).
#[test]
fn s2_a_close_message_needs_f_close_message() {
    let dev = common::device(2);
    let mut r = Raw::new(&common::socket(&dev, 1));
    let mut rx = r.bound(9);
    let sock = common::socket(&dev, 0);
    for (accepted, sent) in [(F_MESSAGING, 0), (F_MESSAGING | F_CLOSE_MESSAGE, 1)] {
        let mut raw = Raw::with_features(&sock, accepted);
        let ep = raw.bound(5);
        raw.set_close_message(&ep, &send_inline((1, 9), 3, 0, b"bye"));
        raw.destroy(&ep);
        spec::settled(&dev, &[&r, &raw]);
        assert_eq!(r.received(&rx), sent, "with {accepted:#x}");
        drop(raw);
        released(&dev, 0);
    }
    let m = r.recv(&mut rx);
    assert_eq!(m.flags.get(), recv_flags::INLINE | recv_flags::CLOSE);
}

/// §2: the device bits in force are those of the connection's last
/// successful SET_FEATURES.
#[test]
fn s2_the_bits_in_force_are_those_of_the_last_set_features() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let ep = raw.bound(9);
    let export = export_payload(&ep);
    assert_eq!(raw.status(cmd::EXPORT, &export), status::OK);
    raw.fe
        .set_features(VERSION_1 | PROTOCOL_FEATURES | F_MESSAGING)
        .unwrap();
    assert_eq!(raw.status(cmd::EXPORT, &export), status::NOT_SUPPORTED);
    raw.fe
        .set_features(VERSION_1 | PROTOCOL_FEATURES | F_IMPLEMENTED)
        .unwrap();
    assert_eq!(raw.status(cmd::EXPORT, &export), status::OK);
}

/// §2: accepting a bit the device did not offer fails SET_FEATURES (a
/// failure reply with REPLY_ACK) and ends the connection; so does a first
/// SET_FEATURES without REPLY_ACK. The node takes a frontend again after.
#[test]
fn s2_accepting_a_bit_not_offered_fails_set_features_and_ends_the_connection() {
    let dev = common::device(1);
    let sock = common::socket(&dev, 0);
    let mut raw = Raw::new(&sock);
    let all = VERSION_1 | PROTOCOL_FEATURES | F_IMPLEMENTED;
    assert!(raw.fe.set_features(all | 1 << 8).is_err(), "bit 8 taken");
    assert!(raw.closed(), "the connection stays open");
    drop(raw);
    released(&dev, 0);
    let fe = Frontend::connect(&sock, 64).unwrap();
    fe.get_features().unwrap();
    fe.set_owner().unwrap();
    let _ = fe.set_features(all | (1 << 40));
    let deadline = std::time::Instant::now() + spec::WAIT;
    while fe.get_features().is_ok() {
        assert!(std::time::Instant::now() < deadline, "connection kept");
    }
    drop(fe);
    released(&dev, 0);
    let mut again = Raw::new(&sock);
    assert_eq!(again.command(cmd::GET_INFO, &[]).0, status::OK);
}

/// §2: RESET_OWNER is acknowledged and otherwise ignored: nothing is
/// freed, no close message is sent, the epoch does not change and the
/// queues keep running (with the device bits still in force).
#[test]
fn s2_reset_owner_is_acknowledged_and_changes_nothing() {
    let dev = common::device(2);
    let mut r = Raw::new(&common::socket(&dev, 1));
    let mut rx = r.bound(9);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut ep = raw.bound(5);
    raw.set_close_message(&ep, &send_inline((1, 9), 3, 0, b"bye"));
    let epoch = raw.config_word(56);
    raw.fe.reset_owner().expect("RESET_OWNER acknowledged");
    assert_eq!(raw.config_word(56), epoch, "the epoch changed");
    assert_eq!(node_state(&dev, 0).0, 1, "the endpoint was freed");
    spec::settled(&dev, &[&r, &raw]);
    assert_eq!(r.received(&rx), 0, "a close message was sent");
    raw.post(&mut ep, &send_inline((1, 9), 4, 0, b"still"));
    let m = r.recv(&mut rx);
    assert_eq!((m.flags.get(), m.tag.get()), (recv_flags::INLINE, 4));
    assert_eq!(raw.status(cmd::EXPORT, &export_payload(&ep)), status::OK);
}

/// §2: after RESET_OWNER the vhost-user library has forgotten the accepted
/// features, so a SET_VRING_ENABLE before the next SET_FEATURES fails and
/// ends the connection.
#[test]
fn s2_after_reset_owner_a_vring_enable_before_set_features_ends_the_connection() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    raw.fe.reset_owner().unwrap();
    assert!(raw.fe.set_vring_enable(2, true).is_err(), "enable taken");
    assert!(raw.closed(), "the connection stays open");
}

/// §2: RESET_DEVICE is not offered; a frontend that sends it without
/// having accepted it loses its connection.
#[test]
fn s2_reset_device_not_accepted_ends_the_connection() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    // No reply asked for: a device that took it would answer nothing.
    raw_message(&raw.fe, FrontendReq::RESET_DEVICE, &[], false);
    assert!(raw.closed(), "the connection stays open");
}

/// §2: with PROTOCOL_FEATURES, a SET_VRING_ENABLE before SET_FEATURES
/// ends the connection.
#[test]
fn s2_a_vring_enable_before_set_features_ends_the_connection() {
    let dev = common::device(1);
    let fe = Frontend::connect(common::socket(&dev, 0), 64).unwrap();
    fe.get_features().unwrap();
    fe.set_owner().unwrap();
    let enable = VhostUserVringState::new(2, 1);
    raw_message(&fe, FrontendReq::SET_VRING_ENABLE, enable.as_slice(), false);
    let deadline = std::time::Instant::now() + spec::WAIT;
    while fe.get_features().is_ok() {
        assert!(std::time::Instant::now() < deadline, "connection kept");
    }
}

/// §2: without PROTOCOL_FEATURES, SET_FEATURES itself enables the queues:
/// a queue set up without SET_VRING_ENABLE serves commands. (With no
/// REPLY_ACK, the next reply, here GET_FEATURES's, says SET_FEATURES was
/// handled.)
#[test]
fn s2_without_protocol_features_set_features_enables_the_queues() {
    let dev = common::device(1);
    let fe = Frontend::connect(common::socket(&dev, 0), 64).unwrap();
    fe.get_features().unwrap();
    fe.set_owner().unwrap();
    // Memory table, ring addresses and sizes, kicks and calls first: they
    // may come before SET_FEATURES.
    let mut raw = Raw::attach(fe, Sharing::Table, false);
    raw.fe.set_features(VERSION_1 | F_MESSAGING).unwrap();
    raw.fe.get_features().unwrap();
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
    let ep = raw.bound(9);
    assert_eq!(raw.stat(&ep, "tx_messages"), 0);
}

/// §2: "in practice no queue runs before SET_FEATURES": without
/// PROTOCOL_FEATURES, SET_FEATURES starts the queues, so a command waiting
/// in the control queue runs with the bits that SET_FEATURES accepted.
#[test]
fn s2_without_protocol_features_the_queues_start_with_the_bits_in_force() {
    let dev = common::device(1);
    let sock = common::socket(&dev, 0);
    let h = CmdHeader {
        opcode: cmd::CREATE_PD.into(),
        reserved: 0.into(),
    };
    let pd = CreatePd {
        doorbell_gpa: 0x9_0000.into(),
    };
    // A race each time: a conforming device wins it every time.
    for attempt in 0..20 {
        let fe = Frontend::connect(&sock, 64).unwrap();
        fe.get_features().unwrap();
        fe.set_owner().unwrap();
        let mut raw = Raw::attach(fe, Sharing::Table, false);
        raw.write(spec::REQ, &[h.as_bytes(), pd.as_bytes()].concat());
        raw.submit(
            &[desc(spec::REQ, 16, F_NEXT, 1), desc(RESP, 64, F_WRITE, 0)],
            0,
        );
        raw.fe.set_features(VERSION_1 | F_MESSAGING).unwrap();
        spec::until("the command answered", || raw.used_index(0) == 1);
        let code = raw.response(16).1;
        assert_eq!(
            code,
            status::OK,
            "attempt {attempt}: served with no bits in force"
        );
        drop(raw);
        released(&dev, 0);
    }
}

/// §2, §2.5: one frontend per node; a second one learns at its first
/// request that the node is busy (once the device has waited 2 s for the
/// first to end), and the refusal changes nothing and is not counted.
/// Once the first leaves, the node takes a new one.
#[test]
fn s2_a_second_frontend_on_a_busy_node_is_refused_at_its_first_request() {
    let dev = common::device(1);
    let sock = common::socket(&dev, 0);
    let mut raw = Raw::new(&sock);
    raw.bound(9);
    let epoch = raw.config_word(56);
    let connections = dev.snapshot().nodes[0].connections;
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = sock.clone();
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        let fe = Frontend::connect(&s2, 64).unwrap();
        tx.send((fe.get_features().is_err(), start.elapsed()))
            .unwrap();
    });
    let (refused, after) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(refused, "the second frontend was served");
    assert!(
        after >= Duration::from_secs(2),
        "refused after {after:?}, not 2 s"
    );
    assert_eq!(raw.config_word(56), epoch, "the refusal changed the epoch");
    assert_eq!(node_state(&dev, 0).0, 1, "the refusal freed the endpoint");
    assert_eq!(dev.snapshot().nodes[0].connections, connections, "counted");
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
    drop(raw);
    released(&dev, 0);
    let mut next = Raw::new(&sock);
    assert_eq!(next.command(cmd::GET_INFO, &[]).0, status::OK);
}

/// §2, §8: a frontend that detaches and attaches again at once is not
/// refused, and the device answers its first message only after the
/// previous connection's state was freed (its close messages sent).
#[test]
fn s2_a_frontend_that_attaches_again_at_once_finds_the_old_state_gone() {
    let dev = common::device(2);
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let rx = r1.bound(9);
    let sock = common::socket(&dev, 0);
    let mut raw = Raw::new(&sock);
    let ep = raw.bound(5);
    raw.set_close_message(&ep, &send_inline((1, 9), 3, 0, b"bye"));
    drop(raw);
    let fe = Frontend::connect(&sock, 64).unwrap();
    fe.get_features().expect("refused");
    assert_eq!(
        node_state(&dev, 0).0,
        0,
        "answered before the old state was freed"
    );
    // Sent when the state was freed; it crosses the fabric after.
    spec::until("the close message", || r1.received(&rx) == 1);
}

/// §2.1, §2.4 step 5: every one of the 64 queues is set up and started
/// (Raw::new does), and the control queue then serves commands.
#[test]
fn s2_1_every_queue_can_be_started() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    assert_eq!(raw.kicks.len(), ulnic_abi::QUEUE_COUNT as usize);
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
}

/// §2.1: a chain with an indirect descriptor is completed with used
/// length 0 and nothing else; the queue goes on.
#[test]
fn s2_1_an_indirect_chain_is_completed_with_used_length_0() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let before = spec::counts(&dev, 0);
    let h = CmdHeader {
        opcode: cmd::CREATE_PD.into(),
        reserved: 0.into(),
    };
    let mut req = h.as_bytes().to_vec();
    let pd = CreatePd {
        doorbell_gpa: 0x9_0000.into(),
    };
    req.extend_from_slice(pd.as_bytes());
    raw.write(spec::REQ, &req);
    raw.fill(RESP, 64, 0xee);
    let indirect = VRING_DESC_F_INDIRECT as u16;
    let chain = [
        desc(spec::REQ, req.len() as u32, F_NEXT, 1),
        desc(RESP, 64, F_WRITE | F_NEXT, 2),
        desc(0x8_3000, 16, indirect, 0),
    ];
    assert_eq!(raw.control_chain(&chain, 0), 0);
    assert_eq!(raw.read(RESP, 64), vec![0xee; 64], "a response was written");
    assert_eq!(spec::counts(&dev, 0), before, "the command ran");
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
}

/// §2.1, §4: a looping chain ends after as many descriptors as the queue
/// has; what it yielded, repeats included, is the request, answered like
/// any other (here a GET_INFO header repeated: 24 bytes of payload where 0
/// are wanted, so BAD_LENGTH).
#[test]
fn s2_1_a_looping_chain_is_the_descriptors_it_yielded() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let h = CmdHeader {
        opcode: cmd::GET_INFO.into(),
        reserved: 0.into(),
    };
    raw.write(spec::REQ, h.as_bytes());
    raw.fill(RESP, 64, 0xee);
    let chain = [
        desc(spec::REQ, 8, F_NEXT, 1),
        desc(RESP, 48, F_WRITE | F_NEXT, 0),
    ];
    assert_eq!(QUEUE, 8, "four of each descriptor");
    let used = raw.control_chain(&chain, 0);
    assert_eq!(raw.response(used).0, 8);
    assert_eq!(raw.response(used).1, status::BAD_LENGTH);
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
}

/// §2.1, §2.2: an available index more than the queue size ahead breaks
/// the queue: nothing more consumed, bit 0 of "broken queues" set, other
/// nodes unaffected, until the driver stops the queue.
#[test]
fn s2_1_an_avail_index_too_far_ahead_breaks_the_queue_until_it_is_stopped() {
    let dev = common::device(2);
    let mut other = Raw::new(&common::socket(&dev, 1));
    let mut raw = Raw::new(&common::socket(&dev, 0));
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
    assert_eq!(raw.config().broken_queues.get(), 0);
    let used = raw.used_index(0);
    raw.publish_avail_index(0, used.wrapping_add(QUEUE + 1));
    raw.kick(0);
    spec::until("queue 0 broken", || raw.config_word(52) == 1);
    spec::settled(&dev, &[&other, &raw]);
    assert_eq!(raw.used_index(0), used, "a chain was consumed");
    assert_eq!(other.command(cmd::GET_INFO, &[]).0, status::OK);
    assert_eq!(other.config_word(52), 0);
    raw.fe.get_vring_base(0).unwrap();
    assert_eq!(raw.config_word(52), 0, "still broken once stopped");
    raw.restart_queue(0);
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
}

/// §2.1: a chain ends at a `next` index not below the queue size; what
/// came before it is the chain.
#[test]
fn s2_1_a_chain_ends_at_a_next_index_past_the_queue() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let h = CmdHeader {
        opcode: cmd::GET_INFO.into(),
        reserved: 0.into(),
    };
    raw.write(spec::REQ, h.as_bytes());
    let chain = [
        desc(spec::REQ, 8, F_NEXT, 1),
        desc(RESP, 48, F_WRITE | F_NEXT, QUEUE),
        desc(RESP + 0x100, 64, F_WRITE, 0),
    ];
    let used = raw.control_chain(&chain, 0);
    assert_eq!((used, raw.response(used).1), (48, status::OK));
    let alone = [desc(RESP, 48, F_WRITE | F_NEXT, 200)];
    let used = raw.control_chain(&alone, 0);
    assert_eq!((used, raw.response(used).1), (8, status::BAD_LENGTH));
}

/// §2.1, §2.2, §6: a notification raised while the notification queue is
/// broken (bit 1 of "broken queues") or stopped is kept, and delivered
/// once the driver has restarted the queue and posted buffers.
#[test]
fn s2_1_notifications_wait_while_the_notification_queue_is_broken() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    let r = raw.bound(9);
    raw.ok(cmd::ARM, ObjectId { id: r.id.into() }.as_bytes());
    let posted = raw.used_index(1).wrapping_add(QUEUE);
    raw.publish_avail_index(1, posted.wrapping_add(QUEUE + 1));
    raw.set_word(&r, ulnic_abi::ctrl::ARM_REQUEST, 1);
    raw.post(&mut s, &send_inline((0, 9), 1, 0, b"x"));
    spec::until("queue 1 broken", || raw.config_word(52) == 2);
    assert_eq!(raw.word(&r, ulnic_abi::ctrl::ARM_ACK), 1);
    assert_eq!(
        raw.command(cmd::GET_INFO, &[]).0,
        status::OK,
        "control queue stopped"
    );
    raw.fe.get_vring_base(1).unwrap();
    assert_eq!(raw.config_word(52), 0, "still broken once stopped");
    raw.restart_queue(1);
    raw.post_notification_buffers();
    let got = raw
        .notification(spec::WAIT)
        .map(|(len, n)| (len, n.endpoint.get()));
    assert_eq!(got, Some((8, r.id)), "the kept notification");
}

/// §2.1, §2.2: a broken queue's bit stays set until the driver stops that
/// queue or the control queue (a reset of the node clears every bit), or
/// the connection ends; stopping a doorbell queue leaves it set.
#[test]
fn s2_1_only_a_reset_or_stopping_the_queue_clears_its_broken_bit() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    let r = raw.bound(9);
    raw.ok(cmd::ARM, ObjectId { id: r.id.into() }.as_bytes());
    spec::fill_counter(&raw.calls[1]);
    raw.set_word(&r, ulnic_abi::ctrl::ARM_REQUEST, 1);
    raw.post(&mut s, &send_inline((0, 9), 1, 0, b"x"));
    spec::until("queue 1 broken", || raw.config_word(52) == 2);
    raw.fe.get_vring_base(2).unwrap();
    assert_eq!(
        raw.config_word(52),
        2,
        "stopping doorbell queue 2 cleared queue 1's bit"
    );
    raw.fe.get_vring_base(0).unwrap();
    assert_eq!(
        raw.config_word(52),
        0,
        "a reset of the node keeps a broken bit"
    );
}

/// §2.1: a notification buffer with an indirect descriptor is completed
/// with used length 0 and not followed; the record goes into the next
/// buffer.
#[test]
fn s2_1_an_indirect_notification_buffer_is_completed_empty() {
    let dev = common::device(1);
    let mut raw = Raw::bare(&common::socket(&dev, 0), F_IMPLEMENTED);
    let mut s = raw.bound(5);
    let r = raw.bound(9);
    raw.ok(cmd::ARM, ObjectId { id: r.id.into() }.as_bytes());
    raw.post_notification_buffers();
    let indirect = desc(spec::NOTES, 16, F_WRITE | VRING_DESC_F_INDIRECT as u16, 0);
    raw.write(spec::RINGS + 0x1000, indirect.as_slice());
    raw.set_word(&r, ulnic_abi::ctrl::ARM_REQUEST, 1);
    raw.post(&mut s, &send_inline((0, 9), 1, 0, b"x"));
    let mut first = None;
    spec::until("a completion", || {
        first = raw.take_used(1);
        first.is_some()
    });
    assert_eq!(first, Some((0, 0)), "the indirect buffer");
    let got = raw
        .notification(spec::WAIT)
        .map(|(len, n)| (len, n.endpoint.get()));
    assert_eq!(got, Some((8, r.id)));
}

/// §2.1: only the control and notification queues can break; the device
/// never walks a doorbell queue, whatever its rings hold.
#[test]
fn s2_1_a_doorbell_queue_never_breaks() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = (raw.bound(5), raw.bound(9));
    raw.publish_avail_index(s.pd.queue as usize, 1000);
    spec::until("doorbell wanted", || {
        raw.word(&s, ulnic_abi::ctrl::DOORBELL_WANTED) != 0
    });
    raw.publish(&mut s, send_inline((0, 9), 1, 0, b"x").as_bytes());
    raw.ring(&s);
    assert_eq!(raw.recv(&mut r).tag.get(), 1);
    assert_eq!(raw.config_word(52), 0);
}

/// §2.2: the config space holds the spec's values, field by field (the
/// version is the spec's, `ulnic_abi::SPEC_VERSION_MAJOR.MINOR`), and
/// GET_INFO (§4.2) returns the same facts.
#[test]
fn s2_2_config_space_holds_the_spec_values_and_get_info_agrees() {
    let dev = common::device_with(3, |b| b.max_endpoints(5).tripwires(7));
    let mut raw = Raw::new(&common::socket(&dev, 2));
    let c = raw.config();
    assert_eq!(c.magic.get(), 0x434e_4c55);
    assert_eq!(CONFIG_MAGIC, 0x434e_4c55);
    let version = (SPEC_VERSION_MAJOR, SPEC_VERSION_MINOR);
    assert_eq!((c.version_major.get(), c.version_minor.get()), version);
    assert_eq!((c.node.get(), c.endpoints.get()), (2, 5));
    assert_eq!((c.inline_max.get(), c.max_message.get()), (96, 1 << 20));
    assert_eq!(c.first_doorbell_queue.get(), 2);
    assert_eq!(c.max_ring_entries.get(), 65536);
    assert_eq!((c.nodes.get(), c.tripwires.get()), (3, 7));
    assert_eq!(c.features.get(), F_IMPLEMENTED);
    assert_eq!(c.apertures.get(), 64);
    assert_eq!(c.broken_queues.get(), 0);
    assert_ne!(c.epoch.get(), 0);
    assert_eq!(c.reserved.get(), 0);
    assert_eq!(raw.config_word(56), c.epoch.get());
    let (used, code, r) = raw.request(cmd::GET_INFO, 0, &[], 504);
    assert_eq!((used, code), (48, status::OK));
    let i = DeviceInfo::read_from_bytes(&r).unwrap();
    assert_eq!((i.version_major.get(), i.version_minor.get()), version);
    assert_eq!((i.node.get(), i.max_endpoints.get()), (2, 5));
    assert_eq!((i.inline_max.get(), i.max_message.get()), (96, 1 << 20));
    assert_eq!((i.nodes.get(), i.features.get()), (3, F_IMPLEMENTED));
    assert_eq!((i.max_tripwires.get(), i.max_apertures.get()), (7, 64));
}

/// §2.2, §2.5: the epoch is nonzero and drawn anew for every connection.
#[test]
fn s2_2_the_epoch_is_new_for_every_connection() {
    let dev = common::device(1);
    let sock = common::socket(&dev, 0);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let mut raw = Raw::new(&sock);
        let e = raw.config_word(56);
        assert_ne!(e, 0);
        assert!(!seen.contains(&e), "epoch {e:#x} again: {seen:x?}");
        seen.push(e);
        drop(raw);
        released(&dev, 0);
    }
}

/// §2.3: a refused memory table ends the connection, and the node's state
/// is freed before the failure reply.
#[test]
fn s2_3_a_refused_table_frees_the_node_before_the_reply() {
    let dev = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    raw.bound(9);
    let epoch = raw.config_word(56);
    assert_eq!(node_state(&dev, 0).0, 1);
    // A region longer than its file.
    let mut bad = raw.region();
    bad.memory_size = 2 * spec::MEM as u64;
    assert!(raw.fe.set_mem_table(&[bad]).is_err(), "the table was taken");
    // The reply came: the state is gone already, with a new epoch.
    let (live, now, _) = node_state(&dev, 0);
    assert_eq!(live, 0, "endpoints outlived the refusal");
    assert_ne!(now, epoch, "the epoch did not change");
    assert!(raw.closed());
}

/// §2.3: a region whose descriptor is no regular file, or whose
/// `mmap_offset + memory_size` passes the file's end or overflows, fails
/// the message
/// and ends the connection; the node takes a frontend again after.
#[test]
fn s2_3_a_region_that_is_no_regular_file_or_past_its_end_is_refused() {
    let dev = common::device(1);
    let sock = common::socket(&dev, 0);
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are fresh and owned here from now on.
    let (r, _w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    for case in 0..3 {
        let mut raw = Raw::new(&sock);
        let mut bad = raw.region();
        match case {
            0 => bad.mmap_handle = r.as_raw_fd(),
            1 => bad.mmap_offset = 4096,
            _ => bad.mmap_offset = u64::MAX - 4095,
        }
        assert!(raw.fe.set_mem_table(&[bad]).is_err(), "case {case} taken");
        assert!(raw.closed(), "case {case}: the connection stays open");
        drop(raw);
        released(&dev, 0);
    }
    let mut raw = Raw::new(&sock);
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
}

/// §2.3: a file that allows sealing and is not sealed gets F_SEAL_SHRINK
/// from the device.
#[test]
fn s2_3_the_device_seals_a_sealable_file_against_shrinking() {
    let dev = common::device(1);
    let raw = Raw::new(&common::socket(&dev, 0));
    // SAFETY: F_GET_SEALS on a descriptor we own.
    let seals = unsafe { libc::fcntl(raw.file.as_raw_fd(), libc::F_GET_SEALS) };
    assert!(seals >= 0);
    assert_ne!(seals & libc::F_SEAL_SHRINK, 0, "seals {seals:#x}");
    assert!(raw.file.set_len(spec::MEM as u64 / 2).is_err());
}

/// §2.3, §4.3: memory may be shared as several regions; a range in
/// adjacent ones (here a segment page table) is in shared memory.
#[test]
fn s2_3_memory_in_two_adjacent_regions() {
    let dev = common::device(1);
    let mut raw = Raw::sharing(&common::socket(&dev, 0), F_IMPLEMENTED, Sharing::Halves);
    raw.post_notification_buffers();
    let mut s = raw.bound(5);
    let mut r = raw.bound(9);
    let pd = raw.pd();
    let mut args = raw.endpoint_args(pd.id, spec::SMALL, 1);
    let table = spec::MEM as u64 / 2 - 4;
    let page = raw.load64(args.seg_table_gpa.get());
    raw.write_obj(table, &zerocopy::little_endian::U64::new(page));
    args.seg_table_gpa = table.into();
    let mut t = raw.create(pd, &args);
    raw.bind(&t, 7);
    raw.write(t.seg, b"across");
    raw.post(&mut t, &send_segment((0, 9), 1, 0, 0, 6));
    assert_eq!(spec::payload(&raw.recv(&mut r)), b"across");
    raw.post(&mut s, &send_inline((0, 7), 2, 0, b"back"));
    assert_eq!(spec::payload(&raw.recv(&mut t)), b"back");
}

/// §2.3: memory is shared with SET_MEM_TABLE; CONFIGURE_MEM_SLOTS is not
/// offered, and a frontend that accepts it anyway and adds a region gets
/// that table checked and served like any other.
#[test]
fn s2_3_add_mem_region_is_not_offered_but_checked_like_a_table() {
    let dev = common::device(1);
    let mut fe = Frontend::connect(common::socket(&dev, 0), 64).unwrap();
    fe.get_features().unwrap();
    fe.set_owner().unwrap();
    fe.set_features(VERSION_1 | PROTOCOL_FEATURES | F_IMPLEMENTED)
        .unwrap();
    let offered = fe.get_protocol_features().unwrap();
    let slots = vhost::vhost_user::message::VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
    assert!(!offered.contains(slots), "CONFIGURE_MEM_SLOTS offered");
    drop(fe);
    released(&dev, 0);
    let mut raw = Raw::sharing(&common::socket(&dev, 0), F_IMPLEMENTED, Sharing::AddRegion);
    raw.post_notification_buffers();
    let (mut s, mut r) = (raw.bound(5), raw.bound(9));
    raw.post(&mut s, &send_inline((0, 9), 2, 0, b"shared"));
    assert_eq!(spec::payload(&raw.recv(&mut r)), b"shared");
}

/// §2.4 step 5: a kick must be an eventfd; another kind of file is
/// refused when the queue starts, and the connection ends.
#[test]
fn s2_4_a_kick_that_is_no_eventfd_is_refused() {
    let dev = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    raw.fe.get_vring_base(2).unwrap();
    let regular = tempfile::tempfile().unwrap();
    let base = raw.region().userspace_addr + spec::RINGS + 2 * 0x1000;
    let config = VringConfigData {
        queue_max_size: QUEUE,
        queue_size: QUEUE,
        flags: 0,
        desc_table_addr: base,
        avail_ring_addr: base + 0x400,
        used_ring_addr: base + 0x800,
        log_addr: None,
    };
    raw.fe.set_vring_enable(2, false).unwrap();
    raw.fe.set_vring_num(2, QUEUE).unwrap();
    raw.fe.set_vring_addr(2, &config).unwrap();
    raw.fe.set_vring_base(2, 0).unwrap();
    // SAFETY: the file's descriptor is valid while `regular` lives, and the
    // borrowed EventFd is forgotten, never closing it.
    let not_eventfd =
        std::mem::ManuallyDrop::new(unsafe { EventFd::from_raw_fd(regular.as_raw_fd()) });
    // Acknowledged: the queue is not enabled, so nothing starts.
    raw.fe.set_vring_kick(2, &not_eventfd).unwrap();
    raw.fe.set_vring_call(2, &EventFd::new(0).unwrap()).unwrap();
    assert!(
        raw.fe.set_vring_enable(2, true).is_err(),
        "a queue started on a kick that is no eventfd"
    );
    assert!(raw.closed(), "the connection stays open");
    drop(raw);
    common::exchange(&dev, 1, 0);
}

/// §2.4 step 5: a started queue keeps its kick; a new one is refused and
/// the connection ends (QEMU stops a queue before it changes its kick).
#[test]
fn s2_4_a_started_queue_keeps_its_kick() {
    let dev = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let other = EventFd::new(0).unwrap();
    assert!(
        raw.fe.set_vring_kick(0, &other).is_err(),
        "a new kick for a started queue was taken"
    );
    assert!(raw.closed(), "the connection stays open");
    drop(raw);
    common::exchange(&dev, 1, 0);
}

/// §2.4 step 5: a SET_VRING_KICK without a file (the polling bit) is
/// acknowledged, but its queue never starts.
#[test]
fn s2_4_a_kick_without_a_file_is_acknowledged_but_never_starts_its_queue() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    raw.fe.get_vring_base(0).unwrap();
    raw.fe.set_vring_enable(0, false).unwrap();
    raw.clear_queue(0);
    let base = raw.region().userspace_addr + spec::RINGS;
    let config = VringConfigData {
        queue_max_size: QUEUE,
        queue_size: QUEUE,
        flags: 0,
        desc_table_addr: base,
        avail_ring_addr: base + 0x400,
        used_ring_addr: base + 0x800,
        log_addr: None,
    };
    raw.fe.set_vring_num(0, QUEUE).unwrap();
    raw.fe.set_vring_addr(0, &config).unwrap();
    raw.fe.set_vring_base(0, 0).unwrap();
    // Queue 0 in bits 0-7, bit 8: no file.
    let polling: u64 = 0x100;
    let ack = raw_message(
        &raw.fe,
        FrontendReq::SET_VRING_KICK,
        &polling.to_le_bytes(),
        true,
    );
    assert_eq!(ack, Some(0), "not acknowledged");
    raw.fe.set_vring_call(0, &EventFd::new(0).unwrap()).unwrap();
    raw.fe.set_vring_enable(0, true).unwrap();
    let h = CmdHeader {
        opcode: cmd::GET_INFO.into(),
        reserved: 0.into(),
    };
    raw.write(spec::REQ, h.as_bytes());
    raw.submit(
        &[desc(spec::REQ, 8, F_NEXT, 1), desc(RESP, 48, F_WRITE, 0)],
        0,
    );
    // Its kick was never given to the device, so only the engine is waited for.
    spec::settled(&dev, &[]);
    assert_eq!(
        raw.used_index(0),
        0,
        "a queue with no kick served a command"
    );
    assert_eq!(raw.config_word(52), 0);
}

/// §2.5: a VM paused and resumed (QEMU `stop`, `cont`): the rings stop and
/// start again where they were, under the same driver. The node forgets its
/// objects (peers get their close messages), then tells the driver with the
/// RESET record and refuses every command but ACK_RESET until it comes.
#[test]
fn s2_5_a_paused_and_resumed_driver_is_told_of_the_reset_and_must_acknowledge_it() {
    let dev = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut peer = Raw::new(&common::socket(&dev, 1));
    let mut inbox = peer.bound(5);
    let ep = raw.bound(9);
    raw.set_close_message(&ep, &send_inline((1, 5), 3, 0, b"bye"));
    let epoch = raw.config_word(56);
    // Nothing to tell a driver that never stopped.
    assert!(raw.notification(Duration::ZERO).is_none());
    for q in [0, 1] {
        raw.fe.set_vring_enable(q, false).unwrap();
    }
    raw.stop_and_resume_queue(0);
    raw.stop_and_resume_queue(1);
    for q in [0, 1] {
        raw.fe.set_vring_enable(q, true).unwrap();
    }
    assert_ne!(raw.config_word(56), epoch, "the epoch did not change");
    // The peer got the close message of the forgotten endpoint.
    spec::settled(&dev, &[&peer]);
    assert_eq!(peer.received(&inbox), 1);
    let m = peer.recv(&mut inbox);
    assert_eq!(m.flags.get(), recv_flags::INLINE | recv_flags::CLOSE);
    let (len, rec) = raw
        .notification(Duration::from_secs(5))
        .expect("no RESET record");
    assert_eq!(len, 8);
    assert_eq!(rec.reason.get(), ulnic_abi::notify_reason::RESET);
    assert_eq!(rec.endpoint.get(), 1, "the node's first reset told");
    // Until ACK_RESET nothing runs, not even GET_INFO.
    assert_eq!(raw.status(cmd::GET_INFO, &[0u8; 0]), status::RESET);
    assert_eq!(raw.status(cmd::CREATE_PD, &[0u8; 8]), status::RESET);
    // A second pause before the first was answered: record 2, and the
    // first record's ACK lifts nothing.
    raw.stop_and_resume_queue(0);
    let (_, rec) = raw
        .notification(Duration::from_secs(5))
        .expect("no second RESET record");
    assert_eq!(rec.endpoint.get(), 2);
    let ack = |r: u32| ObjectId { id: r.into() };
    assert_eq!(raw.status(cmd::ACK_RESET, &ack(1)), status::OK);
    assert_eq!(raw.status(cmd::GET_INFO, &[0u8; 0]), status::RESET);
    assert_eq!(raw.status(cmd::ACK_RESET, &ack(2)), status::OK);
    let gone = ObjectId { id: ep.id.into() };
    assert_eq!(raw.status(cmd::GET_STATS, &gone), status::NOT_FOUND);
    let again = raw.bound(9);
    assert_eq!(raw.status(cmd::EXPORT, &export_payload(&again)), status::OK);
    // ACK_RESET is harmless when nothing waits for it.
    assert_eq!(raw.status(cmd::ACK_RESET, &ack(2)), status::OK);
}

/// §2.5: stopping the control queue frees every object of the node and
/// changes the epoch, but keeps the accepted bits; the numbers of the old
/// objects are unknown to the device afterwards.
#[test]
fn s2_5_stopping_the_control_queue_frees_everything_and_keeps_the_bits() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let ep = raw.bound(9);
    let epoch = raw.config_word(56);
    raw.fe.get_vring_base(0).unwrap();
    let now = raw.config_word(56);
    assert_ne!(now, epoch, "the epoch did not change");
    assert_ne!(now, 0);
    assert_eq!(node_state(&dev, 0).0, 0, "endpoints outlived the stop");
    raw.restart_queue(0);
    let gone = ObjectId { id: ep.id.into() };
    assert_eq!(raw.status(cmd::GET_STATS, &gone), status::NOT_FOUND);
    let again = raw.bound(9);
    assert_eq!(raw.status(cmd::EXPORT, &export_payload(&again)), status::OK);
}
