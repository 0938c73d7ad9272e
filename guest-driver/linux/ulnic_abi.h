/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Generated from abi/src/ by ulnic_abi::c_header(); do not edit.
 * Regenerate: ULNIC_BLESS=1 cargo test -p ulnic-abi */
#ifndef ULNIC_ABI_H
#define ULNIC_ABI_H

#include <linux/types.h>
#include <linux/ioctl.h>
#include <linux/errno.h>

#define ULNIC_CMD_ACK_RESET 0x4
#define ULNIC_CMD_ARM 0x14
#define ULNIC_CMD_BIND_PORT 0x12
#define ULNIC_CMD_CLEAR_TRIPWIRE 0x41
#define ULNIC_CMD_CREATE_ENDPOINT 0x10
#define ULNIC_CMD_CREATE_PD 0x2
#define ULNIC_CMD_DESTROY_ENDPOINT 0x11
#define ULNIC_CMD_DESTROY_PD 0x3
#define ULNIC_CMD_DISARM 0x15
#define ULNIC_CMD_EXPORT 0x30
#define ULNIC_CMD_EXPORT_BUFFER 0x32
#define ULNIC_CMD_EXPORT_PIO 0x18
#define ULNIC_CMD_GET_INFO 0x1
#define ULNIC_CMD_GET_STATS 0x16
#define ULNIC_CMD_HEADER_SIZE 0x8
#define ULNIC_CMD_IMPORT_PIO 0x19
#define ULNIC_CMD_RELEASE_PIO 0x1b
#define ULNIC_CMD_REVOKE 0x31
#define ULNIC_CMD_REVOKE_PIO 0x1a
#define ULNIC_CMD_SET_EVENT_QUEUE 0x17
#define ULNIC_CMD_SET_FILTER 0x13
#define ULNIC_CMD_SET_TRIPWIRE 0x40
#define ULNIC_CMD_UTLB_INVALIDATE 0x21
#define ULNIC_CMD_UTLB_SET_TABLE 0x20
#define ULNIC_CONDITION_RESERVE 0x20
#define ULNIC_CONFIG_MAGIC 0x434e4c55
#define ULNIC_CONFIG_SIZE 0x40
#define ULNIC_CONTROL_QUEUE 0x0
#define ULNIC_CTRL_ARM_ACK 0x280
#define ULNIC_CTRL_ARM_REQUEST 0x240
#define ULNIC_CTRL_BLOCK_SIZE 0x1000
#define ULNIC_CTRL_CLOSE_MESSAGE 0x300
#define ULNIC_CTRL_RING_OFFSET 0x1000
#define ULNIC_DOORBELL_QUEUES 0x3e
#define ULNIC_EVENT_SIZE 0x20
#define ULNIC_FIRST_DOORBELL_QUEUE 0x2
#define ULNIC_FREE_DESC_SIZE 0x20
#define ULNIC_F_CLOSE_MESSAGE_BIT 0x4
#define ULNIC_F_MESSAGING_BIT 0x0
#define ULNIC_F_PIO_BIT 0x7
#define ULNIC_F_RDMA_BIT 0x2
#define ULNIC_F_RETURN_TO_SENDER_BIT 0x6
#define ULNIC_F_TRIPWIRE_BIT 0x3
#define ULNIC_F_UTLB_BIT 0x1
#define ULNIC_INLINE_MAX 0x60
#define ULNIC_IOC_TYPE 0x55
#define ULNIC_MAX_CMD_PAYLOAD 0x200
#define ULNIC_MAX_CTRL_BYTES 0x400000
#define ULNIC_MAX_ENDPOINTS_LIMIT 0x1000
#define ULNIC_MAX_MESSAGE 0x100000
#define ULNIC_MAX_PIO_MAPPINGS 0x4
#define ULNIC_MAX_RING_ENTRIES 0x10000
#define ULNIC_MAX_SEGMENT_BYTES 0x4000000
#define ULNIC_MAX_SEGMENT_PAGES 0x40000
#define ULNIC_MAX_UTLB_ENTRIES 0x100000
#define ULNIC_MAX_UTLB_TABLE_BYTES 0x80000
#define ULNIC_MMAP_DOORBELL 0x1000000000000
#define ULNIC_MMAP_DOORBELL_BITS 0x1000000001000
#define ULNIC_MMAP_ID_SHIFT 0x20
#define ULNIC_MMAP_OFFSET_MASK 0xffffffff
#define ULNIC_MMAP_PIO 0x40000000
#define ULNIC_MMAP_SEGMENT 0x80000000
#define ULNIC_NOTIFY_QUEUE 0x1
#define ULNIC_NOTIFY_REASON_PIO_UNMAPPED 0x2
#define ULNIC_NOTIFY_REASON_RESET 0x1
#define ULNIC_NOTIFY_RECORD_SIZE 0x8
#define ULNIC_NOTIFY_RESET_ENDPOINT 0xffffffff
#define ULNIC_PAGE_ENTRY_SIZE 0x8
#define ULNIC_PAGE_SIZE 0x1000
#define ULNIC_QUEUE_COUNT 0x40
#define ULNIC_RECV_DESC_SIZE 0x80
#define ULNIC_RESP_HEADER_SIZE 0x8
#define ULNIC_SEND_DESC_SIZE 0x80
#define ULNIC_SPEC_VERSION_MAJOR 0x0
#define ULNIC_SPEC_VERSION_MINOR 0xe
#define ULNIC_STATUS_ADDRESS_IN_USE 0x6
#define ULNIC_STATUS_BAD_ADDRESS 0x7
#define ULNIC_STATUS_BAD_LENGTH 0x2
#define ULNIC_STATUS_INVALID_ARGUMENT 0x3
#define ULNIC_STATUS_NOT_FOUND 0x5
#define ULNIC_STATUS_NOT_SUPPORTED 0x8
#define ULNIC_STATUS_NO_RESOURCES 0x4
#define ULNIC_STATUS_OK 0x0
#define ULNIC_STATUS_RESET 0x9
#define ULNIC_STATUS_UNKNOWN_COMMAND 0x1
#define ULNIC_VIRTIO_ID 0x15
#define ULNIC_WATCHER_CLOEXEC 0x1
#define ULNIC_WATCH_REMOVE 0x1

/* Endpoint bitmaps (spec 5.8, 9): bit e % 64 of little-endian word e / 64. */
#define ULNIC_BITMAP_WORD_BITS 64
#define ULNIC_BITMAP_WORD(e) ((e) / ULNIC_BITMAP_WORD_BITS)
#define ULNIC_BITMAP_MASK(e) (1ULL << ((e) % ULNIC_BITMAP_WORD_BITS))

/* The errno (positive) for a device status other than OK (spec 9). */
static inline int ulnic_status_errno(__u32 status)
{
	switch (status) {
	case ULNIC_STATUS_UNKNOWN_COMMAND:
		return EPROTO;
	case ULNIC_STATUS_BAD_LENGTH:
		return EINVAL;
	case ULNIC_STATUS_INVALID_ARGUMENT:
		return EINVAL;
	case ULNIC_STATUS_NO_RESOURCES:
		return ENOSPC;
	case ULNIC_STATUS_NOT_FOUND:
		return ENOENT;
	case ULNIC_STATUS_ADDRESS_IN_USE:
		return EADDRINUSE;
	case ULNIC_STATUS_BAD_ADDRESS:
		return EFAULT;
	case ULNIC_STATUS_NOT_SUPPORTED:
		return EOPNOTSUPP;
	case ULNIC_STATUS_RESET:
		return ENODEV;
	default:
		return EPROTO;
	}
}

/* Device config space (spec §2.2), 64 bytes, read-only. */
struct ulnic_config {
	__le32 magic;
	__le16 version_major;
	__le16 version_minor;
	__le32 node;
	__le32 endpoints;
	__le32 inline_max;
	__le32 max_message;
	__le32 first_doorbell_queue;
	__le32 max_ring_entries;
	__le32 nodes;
	__le32 tripwires;
	__le64 features;
	__le32 apertures;
	__le32 broken_queues;
	__le32 epoch;
	__le32 reserved;
};
_Static_assert(sizeof(struct ulnic_config) == 64, "struct ulnic_config: size");
_Static_assert(__builtin_offsetof(struct ulnic_config, magic) == 0, "struct ulnic_config: magic");
_Static_assert(__builtin_offsetof(struct ulnic_config, version_major) == 4, "struct ulnic_config: version_major");
_Static_assert(__builtin_offsetof(struct ulnic_config, version_minor) == 6, "struct ulnic_config: version_minor");
_Static_assert(__builtin_offsetof(struct ulnic_config, node) == 8, "struct ulnic_config: node");
_Static_assert(__builtin_offsetof(struct ulnic_config, endpoints) == 12, "struct ulnic_config: endpoints");
_Static_assert(__builtin_offsetof(struct ulnic_config, inline_max) == 16, "struct ulnic_config: inline_max");
_Static_assert(__builtin_offsetof(struct ulnic_config, max_message) == 20, "struct ulnic_config: max_message");
_Static_assert(__builtin_offsetof(struct ulnic_config, first_doorbell_queue) == 24, "struct ulnic_config: first_doorbell_queue");
_Static_assert(__builtin_offsetof(struct ulnic_config, max_ring_entries) == 28, "struct ulnic_config: max_ring_entries");
_Static_assert(__builtin_offsetof(struct ulnic_config, nodes) == 32, "struct ulnic_config: nodes");
_Static_assert(__builtin_offsetof(struct ulnic_config, tripwires) == 36, "struct ulnic_config: tripwires");
_Static_assert(__builtin_offsetof(struct ulnic_config, features) == 40, "struct ulnic_config: features");
_Static_assert(__builtin_offsetof(struct ulnic_config, apertures) == 48, "struct ulnic_config: apertures");
_Static_assert(__builtin_offsetof(struct ulnic_config, broken_queues) == 52, "struct ulnic_config: broken_queues");
_Static_assert(__builtin_offsetof(struct ulnic_config, epoch) == 56, "struct ulnic_config: epoch");
_Static_assert(__builtin_offsetof(struct ulnic_config, reserved) == 60, "struct ulnic_config: reserved");

/* Control request header (spec §4), followed by the payload. */
struct ulnic_cmd_header {
	__le32 opcode;
	__le32 reserved;
};
_Static_assert(sizeof(struct ulnic_cmd_header) == 8, "struct ulnic_cmd_header: size");
_Static_assert(__builtin_offsetof(struct ulnic_cmd_header, opcode) == 0, "struct ulnic_cmd_header: opcode");
_Static_assert(__builtin_offsetof(struct ulnic_cmd_header, reserved) == 4, "struct ulnic_cmd_header: reserved");

/* Control response header (spec §4), followed by the result. */
struct ulnic_resp_header {
	__le32 status;
	__le32 reserved;
};
_Static_assert(sizeof(struct ulnic_resp_header) == 8, "struct ulnic_resp_header: size");
_Static_assert(__builtin_offsetof(struct ulnic_resp_header, status) == 0, "struct ulnic_resp_header: status");
_Static_assert(__builtin_offsetof(struct ulnic_resp_header, reserved) == 4, "struct ulnic_resp_header: reserved");

/* A command payload naming one object: DESTROY_PD (a domain), DESTROY_ENDPOINT, ARM, DISARM and GET_STATS (an endpoint). */
struct ulnic_object_id {
	__le32 id;
};
_Static_assert(sizeof(struct ulnic_object_id) == 4, "struct ulnic_object_id: size");
_Static_assert(__builtin_offsetof(struct ulnic_object_id, id) == 0, "struct ulnic_object_id: id");

/* CREATE_PD payload (spec §4.2, §5.8). */
struct ulnic_create_pd {
	__le64 doorbell_gpa;
};
_Static_assert(sizeof(struct ulnic_create_pd) == 8, "struct ulnic_create_pd: size");
_Static_assert(__builtin_offsetof(struct ulnic_create_pd, doorbell_gpa) == 0, "struct ulnic_create_pd: doorbell_gpa");

/* CREATE_PD result. */
struct ulnic_pd_created {
	__le32 id;
	__le32 doorbell_queue;
};
_Static_assert(sizeof(struct ulnic_pd_created) == 8, "struct ulnic_pd_created: size");
_Static_assert(__builtin_offsetof(struct ulnic_pd_created, id) == 0, "struct ulnic_pd_created: id");
_Static_assert(__builtin_offsetof(struct ulnic_pd_created, doorbell_queue) == 4, "struct ulnic_pd_created: doorbell_queue");

/* CREATE_ENDPOINT payload (spec §4.3). */
struct ulnic_create_endpoint {
	__le32 pd;
	__le32 send_entries;
	__le32 recv_entries;
	__le32 free_entries;
	__le32 event_entries;
	__le32 seg_pages;
	__le64 ctrl_gpa;
	__le64 ctrl_len;
	__le64 seg_table_gpa;
};
_Static_assert(sizeof(struct ulnic_create_endpoint) == 48, "struct ulnic_create_endpoint: size");
_Static_assert(__builtin_offsetof(struct ulnic_create_endpoint, pd) == 0, "struct ulnic_create_endpoint: pd");
_Static_assert(__builtin_offsetof(struct ulnic_create_endpoint, send_entries) == 4, "struct ulnic_create_endpoint: send_entries");
_Static_assert(__builtin_offsetof(struct ulnic_create_endpoint, recv_entries) == 8, "struct ulnic_create_endpoint: recv_entries");
_Static_assert(__builtin_offsetof(struct ulnic_create_endpoint, free_entries) == 12, "struct ulnic_create_endpoint: free_entries");
_Static_assert(__builtin_offsetof(struct ulnic_create_endpoint, event_entries) == 16, "struct ulnic_create_endpoint: event_entries");
_Static_assert(__builtin_offsetof(struct ulnic_create_endpoint, seg_pages) == 20, "struct ulnic_create_endpoint: seg_pages");
_Static_assert(__builtin_offsetof(struct ulnic_create_endpoint, ctrl_gpa) == 24, "struct ulnic_create_endpoint: ctrl_gpa");
_Static_assert(__builtin_offsetof(struct ulnic_create_endpoint, ctrl_len) == 32, "struct ulnic_create_endpoint: ctrl_len");
_Static_assert(__builtin_offsetof(struct ulnic_create_endpoint, seg_table_gpa) == 40, "struct ulnic_create_endpoint: seg_table_gpa");

/* CREATE_ENDPOINT result. */
struct ulnic_endpoint_created {
	__le32 id;
	__le32 doorbell_queue;
};
_Static_assert(sizeof(struct ulnic_endpoint_created) == 8, "struct ulnic_endpoint_created: size");
_Static_assert(__builtin_offsetof(struct ulnic_endpoint_created, id) == 0, "struct ulnic_endpoint_created: id");
_Static_assert(__builtin_offsetof(struct ulnic_endpoint_created, doorbell_queue) == 4, "struct ulnic_endpoint_created: doorbell_queue");

/* BIND_PORT payload. */
struct ulnic_bind_port {
	__le32 endpoint;
	__le32 port;
};
_Static_assert(sizeof(struct ulnic_bind_port) == 8, "struct ulnic_bind_port: size");
_Static_assert(__builtin_offsetof(struct ulnic_bind_port, endpoint) == 0, "struct ulnic_bind_port: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_bind_port, port) == 4, "struct ulnic_bind_port: port");

/* SET_FILTER payload header, followed by `count` filter entries. */
struct ulnic_set_filter {
	__le32 endpoint;
	__le32 count;
};
_Static_assert(sizeof(struct ulnic_set_filter) == 8, "struct ulnic_set_filter: size");
_Static_assert(__builtin_offsetof(struct ulnic_set_filter, endpoint) == 0, "struct ulnic_set_filter: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_set_filter, count) == 4, "struct ulnic_set_filter: count");

/* An accept-filter entry (spec §5.7). */
struct ulnic_filter_entry {
	__le32 node;
	__le32 port;
	__le32 tag;
	__le32 tag_mask;
};
_Static_assert(sizeof(struct ulnic_filter_entry) == 16, "struct ulnic_filter_entry: size");
_Static_assert(__builtin_offsetof(struct ulnic_filter_entry, node) == 0, "struct ulnic_filter_entry: node");
_Static_assert(__builtin_offsetof(struct ulnic_filter_entry, port) == 4, "struct ulnic_filter_entry: port");
_Static_assert(__builtin_offsetof(struct ulnic_filter_entry, tag) == 8, "struct ulnic_filter_entry: tag");
_Static_assert(__builtin_offsetof(struct ulnic_filter_entry, tag_mask) == 12, "struct ulnic_filter_entry: tag_mask");

/* EXPORT payload (spec §5.12); the result is a cookie. */
struct ulnic_export {
	__le32 endpoint;
	__le32 perms;
	__le64 offset;
	__le64 len;
};
_Static_assert(sizeof(struct ulnic_export) == 24, "struct ulnic_export: size");
_Static_assert(__builtin_offsetof(struct ulnic_export, endpoint) == 0, "struct ulnic_export: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_export, perms) == 4, "struct ulnic_export: perms");
_Static_assert(__builtin_offsetof(struct ulnic_export, offset) == 8, "struct ulnic_export: offset");
_Static_assert(__builtin_offsetof(struct ulnic_export, len) == 16, "struct ulnic_export: len");

/* EXPORT_BUFFER payload (spec §5.14); the result is a cookie. */
struct ulnic_export_buffer {
	__le32 endpoint;
	__le32 perms;
	__le64 page_offset;
	__le64 len;
	__le32 utlb_first;
	__le32 utlb_count;
};
_Static_assert(sizeof(struct ulnic_export_buffer) == 32, "struct ulnic_export_buffer: size");
_Static_assert(__builtin_offsetof(struct ulnic_export_buffer, endpoint) == 0, "struct ulnic_export_buffer: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_export_buffer, perms) == 4, "struct ulnic_export_buffer: perms");
_Static_assert(__builtin_offsetof(struct ulnic_export_buffer, page_offset) == 8, "struct ulnic_export_buffer: page_offset");
_Static_assert(__builtin_offsetof(struct ulnic_export_buffer, len) == 16, "struct ulnic_export_buffer: len");
_Static_assert(__builtin_offsetof(struct ulnic_export_buffer, utlb_first) == 24, "struct ulnic_export_buffer: utlb_first");
_Static_assert(__builtin_offsetof(struct ulnic_export_buffer, utlb_count) == 28, "struct ulnic_export_buffer: utlb_count");

/* REVOKE payload. */
struct ulnic_revoke {
	__le32 endpoint;
	__le32 aperture;
};
_Static_assert(sizeof(struct ulnic_revoke) == 8, "struct ulnic_revoke: size");
_Static_assert(__builtin_offsetof(struct ulnic_revoke, endpoint) == 0, "struct ulnic_revoke: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_revoke, aperture) == 4, "struct ulnic_revoke: aperture");

/* SET_EVENT_QUEUE payload (spec §6.1). */
struct ulnic_set_event_queue {
	__le32 endpoint;
	__le32 queue;
	__le64 cookie;
};
_Static_assert(sizeof(struct ulnic_set_event_queue) == 16, "struct ulnic_set_event_queue: size");
_Static_assert(__builtin_offsetof(struct ulnic_set_event_queue, endpoint) == 0, "struct ulnic_set_event_queue: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_set_event_queue, queue) == 4, "struct ulnic_set_event_queue: queue");
_Static_assert(__builtin_offsetof(struct ulnic_set_event_queue, cookie) == 8, "struct ulnic_set_event_queue: cookie");

/* EXPORT_PIO payload (spec §6.2). */
struct ulnic_export_pio {
	__le32 endpoint;
	__le32 pages;
	__le32 importer;
	__le32 reserved;
};
_Static_assert(sizeof(struct ulnic_export_pio) == 16, "struct ulnic_export_pio: size");
_Static_assert(__builtin_offsetof(struct ulnic_export_pio, endpoint) == 0, "struct ulnic_export_pio: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_export_pio, pages) == 4, "struct ulnic_export_pio: pages");
_Static_assert(__builtin_offsetof(struct ulnic_export_pio, importer) == 8, "struct ulnic_export_pio: importer");
_Static_assert(__builtin_offsetof(struct ulnic_export_pio, reserved) == 12, "struct ulnic_export_pio: reserved");

/* EXPORT_PIO result (spec §6.2). */
struct ulnic_pio_exported {
	__le32 window;
	__le32 reserved;
	__le64 key;
	__le64 offset;
};
_Static_assert(sizeof(struct ulnic_pio_exported) == 24, "struct ulnic_pio_exported: size");
_Static_assert(__builtin_offsetof(struct ulnic_pio_exported, window) == 0, "struct ulnic_pio_exported: window");
_Static_assert(__builtin_offsetof(struct ulnic_pio_exported, reserved) == 4, "struct ulnic_pio_exported: reserved");
_Static_assert(__builtin_offsetof(struct ulnic_pio_exported, key) == 8, "struct ulnic_pio_exported: key");
_Static_assert(__builtin_offsetof(struct ulnic_pio_exported, offset) == 16, "struct ulnic_pio_exported: offset");

/* IMPORT_PIO payload (spec §6.2). */
struct ulnic_import_pio {
	__le32 endpoint;
	__le32 node;
	__le32 window;
	__le32 reserved;
	__le64 key;
};
_Static_assert(sizeof(struct ulnic_import_pio) == 24, "struct ulnic_import_pio: size");
_Static_assert(__builtin_offsetof(struct ulnic_import_pio, endpoint) == 0, "struct ulnic_import_pio: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_import_pio, node) == 4, "struct ulnic_import_pio: node");
_Static_assert(__builtin_offsetof(struct ulnic_import_pio, window) == 8, "struct ulnic_import_pio: window");
_Static_assert(__builtin_offsetof(struct ulnic_import_pio, reserved) == 12, "struct ulnic_import_pio: reserved");
_Static_assert(__builtin_offsetof(struct ulnic_import_pio, key) == 16, "struct ulnic_import_pio: key");

/* IMPORT_PIO result (spec §6.2). */
struct ulnic_pio_imported {
	__le32 import;
	__le32 pages;
	__le64 offset;
};
_Static_assert(sizeof(struct ulnic_pio_imported) == 16, "struct ulnic_pio_imported: size");
_Static_assert(__builtin_offsetof(struct ulnic_pio_imported, import) == 0, "struct ulnic_pio_imported: import");
_Static_assert(__builtin_offsetof(struct ulnic_pio_imported, pages) == 4, "struct ulnic_pio_imported: pages");
_Static_assert(__builtin_offsetof(struct ulnic_pio_imported, offset) == 8, "struct ulnic_pio_imported: offset");

/* REVOKE_PIO and RELEASE_PIO payload (spec §6.2). */
struct ulnic_pio_object {
	__le32 endpoint;
	__le32 id;
};
_Static_assert(sizeof(struct ulnic_pio_object) == 8, "struct ulnic_pio_object: size");
_Static_assert(__builtin_offsetof(struct ulnic_pio_object, endpoint) == 0, "struct ulnic_pio_object: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_pio_object, id) == 4, "struct ulnic_pio_object: id");

/* SET_TRIPWIRE payload (spec §5.13); the result is the tripwire id (`ObjectId`). */
struct ulnic_set_tripwire {
	__le32 endpoint;
	__le32 aperture;
	__le64 offset;
	__le64 len;
	__le32 flags;
	__le32 reserved;
	__le64 user;
};
_Static_assert(sizeof(struct ulnic_set_tripwire) == 40, "struct ulnic_set_tripwire: size");
_Static_assert(__builtin_offsetof(struct ulnic_set_tripwire, endpoint) == 0, "struct ulnic_set_tripwire: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_set_tripwire, aperture) == 4, "struct ulnic_set_tripwire: aperture");
_Static_assert(__builtin_offsetof(struct ulnic_set_tripwire, offset) == 8, "struct ulnic_set_tripwire: offset");
_Static_assert(__builtin_offsetof(struct ulnic_set_tripwire, len) == 16, "struct ulnic_set_tripwire: len");
_Static_assert(__builtin_offsetof(struct ulnic_set_tripwire, flags) == 24, "struct ulnic_set_tripwire: flags");
_Static_assert(__builtin_offsetof(struct ulnic_set_tripwire, reserved) == 28, "struct ulnic_set_tripwire: reserved");
_Static_assert(__builtin_offsetof(struct ulnic_set_tripwire, user) == 32, "struct ulnic_set_tripwire: user");

/* CLEAR_TRIPWIRE payload. */
struct ulnic_clear_tripwire {
	__le32 endpoint;
	__le32 tripwire;
};
_Static_assert(sizeof(struct ulnic_clear_tripwire) == 8, "struct ulnic_clear_tripwire: size");
_Static_assert(__builtin_offsetof(struct ulnic_clear_tripwire, endpoint) == 0, "struct ulnic_clear_tripwire: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_clear_tripwire, tripwire) == 4, "struct ulnic_clear_tripwire: tripwire");

/* UTLB_SET_TABLE payload (spec §5.14). */
struct ulnic_utlb_set_table {
	__le32 pd;
	__le32 entries;
	__le64 table_gpa;
};
_Static_assert(sizeof(struct ulnic_utlb_set_table) == 16, "struct ulnic_utlb_set_table: size");
_Static_assert(__builtin_offsetof(struct ulnic_utlb_set_table, pd) == 0, "struct ulnic_utlb_set_table: pd");
_Static_assert(__builtin_offsetof(struct ulnic_utlb_set_table, entries) == 4, "struct ulnic_utlb_set_table: entries");
_Static_assert(__builtin_offsetof(struct ulnic_utlb_set_table, table_gpa) == 8, "struct ulnic_utlb_set_table: table_gpa");

/* UTLB_INVALIDATE payload (spec §5.14). */
struct ulnic_utlb_invalidate {
	__le32 pd;
	__le32 first;
	__le32 count;
};
_Static_assert(sizeof(struct ulnic_utlb_invalidate) == 12, "struct ulnic_utlb_invalidate: size");
_Static_assert(__builtin_offsetof(struct ulnic_utlb_invalidate, pd) == 0, "struct ulnic_utlb_invalidate: pd");
_Static_assert(__builtin_offsetof(struct ulnic_utlb_invalidate, first) == 4, "struct ulnic_utlb_invalidate: first");
_Static_assert(__builtin_offsetof(struct ulnic_utlb_invalidate, count) == 8, "struct ulnic_utlb_invalidate: count");

/* GET_INFO result (spec §4.2). */
struct ulnic_device_info {
	__le16 version_major;
	__le16 version_minor;
	__le32 node;
	__le32 max_endpoints;
	__le32 inline_max;
	__le32 max_message;
	__le32 nodes;
	__le64 features;
	__le32 max_tripwires;
	__le32 max_apertures;
};
_Static_assert(sizeof(struct ulnic_device_info) == 40, "struct ulnic_device_info: size");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, version_major) == 0, "struct ulnic_device_info: version_major");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, version_minor) == 2, "struct ulnic_device_info: version_minor");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, node) == 4, "struct ulnic_device_info: node");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, max_endpoints) == 8, "struct ulnic_device_info: max_endpoints");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, inline_max) == 12, "struct ulnic_device_info: inline_max");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, max_message) == 16, "struct ulnic_device_info: max_message");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, nodes) == 20, "struct ulnic_device_info: nodes");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, features) == 24, "struct ulnic_device_info: features");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, max_tripwires) == 32, "struct ulnic_device_info: max_tripwires");
_Static_assert(__builtin_offsetof(struct ulnic_device_info, max_apertures) == 36, "struct ulnic_device_info: max_apertures");

/* An aperture's cookie (spec §5.12). */
struct ulnic_cookie {
	__le32 node;
	__le32 aperture;
	__le32 generation;
	__le32 reserved;
	__le64 key;
};
_Static_assert(sizeof(struct ulnic_cookie) == 24, "struct ulnic_cookie: size");
_Static_assert(__builtin_offsetof(struct ulnic_cookie, node) == 0, "struct ulnic_cookie: node");
_Static_assert(__builtin_offsetof(struct ulnic_cookie, aperture) == 4, "struct ulnic_cookie: aperture");
_Static_assert(__builtin_offsetof(struct ulnic_cookie, generation) == 8, "struct ulnic_cookie: generation");
_Static_assert(__builtin_offsetof(struct ulnic_cookie, reserved) == 12, "struct ulnic_cookie: reserved");
_Static_assert(__builtin_offsetof(struct ulnic_cookie, key) == 16, "struct ulnic_cookie: key");

/* A send descriptor (spec §5.3), 128 bytes. */
struct ulnic_send_desc {
	__le16 opcode;
	__le16 flags;
	__le32 len;
	__le32 dest_node;
	__le32 dest_port;
	__le32 tag;
	__le32 reserved;
	__le64 user_id;
	__u8 data[96];
};
_Static_assert(sizeof(struct ulnic_send_desc) == 128, "struct ulnic_send_desc: size");
_Static_assert(__builtin_offsetof(struct ulnic_send_desc, opcode) == 0, "struct ulnic_send_desc: opcode");
_Static_assert(__builtin_offsetof(struct ulnic_send_desc, flags) == 2, "struct ulnic_send_desc: flags");
_Static_assert(__builtin_offsetof(struct ulnic_send_desc, len) == 4, "struct ulnic_send_desc: len");
_Static_assert(__builtin_offsetof(struct ulnic_send_desc, dest_node) == 8, "struct ulnic_send_desc: dest_node");
_Static_assert(__builtin_offsetof(struct ulnic_send_desc, dest_port) == 12, "struct ulnic_send_desc: dest_port");
_Static_assert(__builtin_offsetof(struct ulnic_send_desc, tag) == 16, "struct ulnic_send_desc: tag");
_Static_assert(__builtin_offsetof(struct ulnic_send_desc, reserved) == 20, "struct ulnic_send_desc: reserved");
_Static_assert(__builtin_offsetof(struct ulnic_send_desc, user_id) == 24, "struct ulnic_send_desc: user_id");
_Static_assert(__builtin_offsetof(struct ulnic_send_desc, data) == 32, "struct ulnic_send_desc: data");

/* Where a non-inline send's payload is: the first bytes of `SendDesc::data` (spec §5.3). */
struct ulnic_send_buffer {
	__le64 offset;
	__le32 utlb_first;
	__le32 utlb_count;
};
_Static_assert(sizeof(struct ulnic_send_buffer) == 16, "struct ulnic_send_buffer: size");
_Static_assert(__builtin_offsetof(struct ulnic_send_buffer, offset) == 0, "struct ulnic_send_buffer: offset");
_Static_assert(__builtin_offsetof(struct ulnic_send_buffer, utlb_first) == 8, "struct ulnic_send_buffer: utlb_first");
_Static_assert(__builtin_offsetof(struct ulnic_send_buffer, utlb_count) == 12, "struct ulnic_send_buffer: utlb_count");

/* An RDMA descriptor in the send ring (spec §5.12), 128 bytes. */
struct ulnic_rdma_desc {
	__le16 opcode;
	__le16 flags;
	__le32 len;
	__le32 cookie_node;
	__le32 cookie_aperture;
	__le32 cookie_generation;
	__le32 reserved;
	__le64 user_id;
	__le64 cookie_key;
	__le64 remote_offset;
	__le64 local_offset;
	__le64 immediate;
	__le32 utlb_first;
	__le32 utlb_count;
	__u8 unused[56];
};
_Static_assert(sizeof(struct ulnic_rdma_desc) == 128, "struct ulnic_rdma_desc: size");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, opcode) == 0, "struct ulnic_rdma_desc: opcode");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, flags) == 2, "struct ulnic_rdma_desc: flags");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, len) == 4, "struct ulnic_rdma_desc: len");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, cookie_node) == 8, "struct ulnic_rdma_desc: cookie_node");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, cookie_aperture) == 12, "struct ulnic_rdma_desc: cookie_aperture");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, cookie_generation) == 16, "struct ulnic_rdma_desc: cookie_generation");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, reserved) == 20, "struct ulnic_rdma_desc: reserved");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, user_id) == 24, "struct ulnic_rdma_desc: user_id");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, cookie_key) == 32, "struct ulnic_rdma_desc: cookie_key");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, remote_offset) == 40, "struct ulnic_rdma_desc: remote_offset");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, local_offset) == 48, "struct ulnic_rdma_desc: local_offset");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, immediate) == 56, "struct ulnic_rdma_desc: immediate");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, utlb_first) == 64, "struct ulnic_rdma_desc: utlb_first");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, utlb_count) == 68, "struct ulnic_rdma_desc: utlb_count");
_Static_assert(__builtin_offsetof(struct ulnic_rdma_desc, unused) == 72, "struct ulnic_rdma_desc: unused");

/* A REDIRECT or REDIRECT_END descriptor (spec §5.15), 128 bytes. */
struct ulnic_redirect_desc {
	__le16 opcode;
	__le16 flags;
	__le32 len;
	__le32 aperture;
	__u8 unused0[12];
	__le64 id;
	__u8 unused1[8];
	__le64 offset;
	__le64 page_offset;
	__u8 unused2[8];
	__le32 utlb_first;
	__le32 utlb_count;
	__u8 unused3[56];
};
_Static_assert(sizeof(struct ulnic_redirect_desc) == 128, "struct ulnic_redirect_desc: size");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, opcode) == 0, "struct ulnic_redirect_desc: opcode");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, flags) == 2, "struct ulnic_redirect_desc: flags");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, len) == 4, "struct ulnic_redirect_desc: len");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, aperture) == 8, "struct ulnic_redirect_desc: aperture");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, unused0) == 12, "struct ulnic_redirect_desc: unused0");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, id) == 24, "struct ulnic_redirect_desc: id");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, unused1) == 32, "struct ulnic_redirect_desc: unused1");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, offset) == 40, "struct ulnic_redirect_desc: offset");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, page_offset) == 48, "struct ulnic_redirect_desc: page_offset");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, unused2) == 56, "struct ulnic_redirect_desc: unused2");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, utlb_first) == 64, "struct ulnic_redirect_desc: utlb_first");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, utlb_count) == 68, "struct ulnic_redirect_desc: utlb_count");
_Static_assert(__builtin_offsetof(struct ulnic_redirect_desc, unused3) == 72, "struct ulnic_redirect_desc: unused3");

/* A receive descriptor (spec §5.4), 128 bytes. */
struct ulnic_recv_desc {
	__le16 flags;
	__le16 reserved0;
	__le32 len;
	__le32 src_node;
	__le32 src_port;
	__le32 tag;
	__le32 session;
	__le64 buf_id;
	__u8 data[96];
};
_Static_assert(sizeof(struct ulnic_recv_desc) == 128, "struct ulnic_recv_desc: size");
_Static_assert(__builtin_offsetof(struct ulnic_recv_desc, flags) == 0, "struct ulnic_recv_desc: flags");
_Static_assert(__builtin_offsetof(struct ulnic_recv_desc, reserved0) == 2, "struct ulnic_recv_desc: reserved0");
_Static_assert(__builtin_offsetof(struct ulnic_recv_desc, len) == 4, "struct ulnic_recv_desc: len");
_Static_assert(__builtin_offsetof(struct ulnic_recv_desc, src_node) == 8, "struct ulnic_recv_desc: src_node");
_Static_assert(__builtin_offsetof(struct ulnic_recv_desc, src_port) == 12, "struct ulnic_recv_desc: src_port");
_Static_assert(__builtin_offsetof(struct ulnic_recv_desc, tag) == 16, "struct ulnic_recv_desc: tag");
_Static_assert(__builtin_offsetof(struct ulnic_recv_desc, session) == 20, "struct ulnic_recv_desc: session");
_Static_assert(__builtin_offsetof(struct ulnic_recv_desc, buf_id) == 24, "struct ulnic_recv_desc: buf_id");
_Static_assert(__builtin_offsetof(struct ulnic_recv_desc, data) == 32, "struct ulnic_recv_desc: data");

/* A free descriptor (spec §5.5). */
struct ulnic_free_desc {
	__le64 seg_offset;
	__le32 len;
	__le32 reserved0;
	__le64 user_id;
	__le64 reserved1;
};
_Static_assert(sizeof(struct ulnic_free_desc) == 32, "struct ulnic_free_desc: size");
_Static_assert(__builtin_offsetof(struct ulnic_free_desc, seg_offset) == 0, "struct ulnic_free_desc: seg_offset");
_Static_assert(__builtin_offsetof(struct ulnic_free_desc, len) == 8, "struct ulnic_free_desc: len");
_Static_assert(__builtin_offsetof(struct ulnic_free_desc, reserved0) == 12, "struct ulnic_free_desc: reserved0");
_Static_assert(__builtin_offsetof(struct ulnic_free_desc, user_id) == 16, "struct ulnic_free_desc: user_id");
_Static_assert(__builtin_offsetof(struct ulnic_free_desc, reserved1) == 24, "struct ulnic_free_desc: reserved1");

/* An event record: one entry of the event ring (spec §5.6). */
struct ulnic_event_record {
	__le16 kind;
	__le16 code;
	__le32 aux;
	__le64 user_id;
	__le32 node;
	__le32 port;
	__le32 len;
	__le32 session;
};
_Static_assert(sizeof(struct ulnic_event_record) == 32, "struct ulnic_event_record: size");
_Static_assert(__builtin_offsetof(struct ulnic_event_record, kind) == 0, "struct ulnic_event_record: kind");
_Static_assert(__builtin_offsetof(struct ulnic_event_record, code) == 2, "struct ulnic_event_record: code");
_Static_assert(__builtin_offsetof(struct ulnic_event_record, aux) == 4, "struct ulnic_event_record: aux");
_Static_assert(__builtin_offsetof(struct ulnic_event_record, user_id) == 8, "struct ulnic_event_record: user_id");
_Static_assert(__builtin_offsetof(struct ulnic_event_record, node) == 16, "struct ulnic_event_record: node");
_Static_assert(__builtin_offsetof(struct ulnic_event_record, port) == 20, "struct ulnic_event_record: port");
_Static_assert(__builtin_offsetof(struct ulnic_event_record, len) == 24, "struct ulnic_event_record: len");
_Static_assert(__builtin_offsetof(struct ulnic_event_record, session) == 28, "struct ulnic_event_record: session");

/* A notification record (spec §6). */
struct ulnic_notify_record {
	__le32 endpoint;
	__le32 reason;
};
_Static_assert(sizeof(struct ulnic_notify_record) == 8, "struct ulnic_notify_record: size");
_Static_assert(__builtin_offsetof(struct ulnic_notify_record, endpoint) == 0, "struct ulnic_notify_record: endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_notify_record, reason) == 4, "struct ulnic_notify_record: reason");

/* A fabric packet's header (spec §10.3), 72 bytes, followed by `len` payload bytes. Used between switches inside a device, between devices over UDP and in captures. */
struct ulnic_packet_header {
	__le16 magic;
	__le16 version;
	__le16 kind;
	__le16 hop;
	__le32 src_node;
	__le32 dst_node;
	__le32 src_endpoint;
	__le32 src_port;
	__le32 dst_port;
	__le32 epoch;
	__le32 seq;
	__le16 frag;
	__le16 frags;
	__le32 msg_len;
	__le32 offset;
	__le32 len;
	__le32 tag;
	__le16 code;
	__le16 route_len;
	__le32 crc;
	__le16 opcode;
	__le16 flags;
	__le32 session;
};
_Static_assert(sizeof(struct ulnic_packet_header) == 72, "struct ulnic_packet_header: size");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, magic) == 0, "struct ulnic_packet_header: magic");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, version) == 2, "struct ulnic_packet_header: version");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, kind) == 4, "struct ulnic_packet_header: kind");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, hop) == 6, "struct ulnic_packet_header: hop");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, src_node) == 8, "struct ulnic_packet_header: src_node");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, dst_node) == 12, "struct ulnic_packet_header: dst_node");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, src_endpoint) == 16, "struct ulnic_packet_header: src_endpoint");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, src_port) == 20, "struct ulnic_packet_header: src_port");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, dst_port) == 24, "struct ulnic_packet_header: dst_port");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, epoch) == 28, "struct ulnic_packet_header: epoch");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, seq) == 32, "struct ulnic_packet_header: seq");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, frag) == 36, "struct ulnic_packet_header: frag");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, frags) == 38, "struct ulnic_packet_header: frags");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, msg_len) == 40, "struct ulnic_packet_header: msg_len");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, offset) == 44, "struct ulnic_packet_header: offset");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, len) == 48, "struct ulnic_packet_header: len");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, tag) == 52, "struct ulnic_packet_header: tag");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, code) == 56, "struct ulnic_packet_header: code");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, route_len) == 58, "struct ulnic_packet_header: route_len");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, crc) == 60, "struct ulnic_packet_header: crc");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, opcode) == 64, "struct ulnic_packet_header: opcode");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, flags) == 66, "struct ulnic_packet_header: flags");
_Static_assert(__builtin_offsetof(struct ulnic_packet_header, session) == 68, "struct ulnic_packet_header: session");

/* `IOC_CREATE_EP` argument (spec §9). */
struct ulnic_ioc_create_ep {
	__le32 send_entries;
	__le32 recv_entries;
	__le32 free_entries;
	__le32 event_entries;
	__le64 segment_bytes;
	__le32 id;
	__le32 doorbell_queue;
	__le64 ctrl_len;
	__le64 segment_len;
	__u8 reserved[16];
};
_Static_assert(sizeof(struct ulnic_ioc_create_ep) == 64, "struct ulnic_ioc_create_ep: size");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, send_entries) == 0, "struct ulnic_ioc_create_ep: send_entries");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, recv_entries) == 4, "struct ulnic_ioc_create_ep: recv_entries");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, free_entries) == 8, "struct ulnic_ioc_create_ep: free_entries");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, event_entries) == 12, "struct ulnic_ioc_create_ep: event_entries");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, segment_bytes) == 16, "struct ulnic_ioc_create_ep: segment_bytes");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, id) == 24, "struct ulnic_ioc_create_ep: id");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, doorbell_queue) == 28, "struct ulnic_ioc_create_ep: doorbell_queue");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, ctrl_len) == 32, "struct ulnic_ioc_create_ep: ctrl_len");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, segment_len) == 40, "struct ulnic_ioc_create_ep: segment_len");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_create_ep, reserved) == 48, "struct ulnic_ioc_create_ep: reserved");

/* `IOC_COMMAND` argument (spec §9). */
struct ulnic_ioc_command {
	__le32 opcode;
	__le32 status;
	__le32 in_len;
	__le32 out_len;
	__u8 data[512];
};
_Static_assert(sizeof(struct ulnic_ioc_command) == 528, "struct ulnic_ioc_command: size");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_command, opcode) == 0, "struct ulnic_ioc_command: opcode");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_command, status) == 4, "struct ulnic_ioc_command: status");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_command, in_len) == 8, "struct ulnic_ioc_command: in_len");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_command, out_len) == 12, "struct ulnic_ioc_command: out_len");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_command, data) == 16, "struct ulnic_ioc_command: data");

/* `IOC_WAIT` argument (spec §9). */
struct ulnic_ioc_wait {
	__le32 id;
	__le32 timeout_ms;
};
_Static_assert(sizeof(struct ulnic_ioc_wait) == 8, "struct ulnic_ioc_wait: size");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_wait, id) == 0, "struct ulnic_ioc_wait: id");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_wait, timeout_ms) == 4, "struct ulnic_ioc_wait: timeout_ms");

/* `IOC_UTLB_INSTALL` argument (spec §9). */
struct ulnic_ioc_utlb_install {
	__le32 first;
	__le32 count;
	__le64 va;
};
_Static_assert(sizeof(struct ulnic_ioc_utlb_install) == 16, "struct ulnic_ioc_utlb_install: size");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_utlb_install, first) == 0, "struct ulnic_ioc_utlb_install: first");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_utlb_install, count) == 4, "struct ulnic_ioc_utlb_install: count");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_utlb_install, va) == 8, "struct ulnic_ioc_utlb_install: va");

/* `IOC_TAKE_NOTIFIED` result (spec §9): which of the file's endpoints were notified, now taken. */
struct ulnic_ioc_notified {
	__le64 bits[64];
};
_Static_assert(sizeof(struct ulnic_ioc_notified) == 512, "struct ulnic_ioc_notified: size");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_notified, bits) == 0, "struct ulnic_ioc_notified: bits");

/* `IOC_WATCH` argument (spec §9). */
struct ulnic_ioc_watch {
	__le32 id;
	__le32 watcher;
	__le32 flags;
	__le32 reserved;
};
_Static_assert(sizeof(struct ulnic_ioc_watch) == 16, "struct ulnic_ioc_watch: size");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_watch, id) == 0, "struct ulnic_ioc_watch: id");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_watch, watcher) == 4, "struct ulnic_ioc_watch: watcher");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_watch, flags) == 8, "struct ulnic_ioc_watch: flags");
_Static_assert(__builtin_offsetof(struct ulnic_ioc_watch, reserved) == 12, "struct ulnic_ioc_watch: reserved");

/* ioctls of /dev/ulnicN (spec §9); arguments are the structs above. */
#define ULNIC_IOC_INFO _IOR(ULNIC_IOC_TYPE, 1, struct ulnic_device_info)
_Static_assert(ULNIC_IOC_INFO == 0x80285501u, "ULNIC_IOC_INFO");
#define ULNIC_IOC_CREATE_EP _IOWR(ULNIC_IOC_TYPE, 2, struct ulnic_ioc_create_ep)
_Static_assert(ULNIC_IOC_CREATE_EP == 0xc0405502u, "ULNIC_IOC_CREATE_EP");
#define ULNIC_IOC_DESTROY_EP _IOW(ULNIC_IOC_TYPE, 3, __u32)
_Static_assert(ULNIC_IOC_DESTROY_EP == 0x40045503u, "ULNIC_IOC_DESTROY_EP");
#define ULNIC_IOC_COMMAND _IOWR(ULNIC_IOC_TYPE, 4, struct ulnic_ioc_command)
_Static_assert(ULNIC_IOC_COMMAND == 0xc2105504u, "ULNIC_IOC_COMMAND");
#define ULNIC_IOC_KICK _IOW(ULNIC_IOC_TYPE, 5, __u32)
_Static_assert(ULNIC_IOC_KICK == 0x40045505u, "ULNIC_IOC_KICK");
#define ULNIC_IOC_WAIT _IOW(ULNIC_IOC_TYPE, 6, struct ulnic_ioc_wait)
_Static_assert(ULNIC_IOC_WAIT == 0x40085506u, "ULNIC_IOC_WAIT");
#define ULNIC_IOC_UTLB_INIT _IOW(ULNIC_IOC_TYPE, 7, __u32)
_Static_assert(ULNIC_IOC_UTLB_INIT == 0x40045507u, "ULNIC_IOC_UTLB_INIT");
#define ULNIC_IOC_UTLB_INSTALL _IOW(ULNIC_IOC_TYPE, 8, struct ulnic_ioc_utlb_install)
_Static_assert(ULNIC_IOC_UTLB_INSTALL == 0x40105508u, "ULNIC_IOC_UTLB_INSTALL");
#define ULNIC_IOC_TAKE_NOTIFIED _IOR(ULNIC_IOC_TYPE, 9, struct ulnic_ioc_notified)
_Static_assert(ULNIC_IOC_TAKE_NOTIFIED == 0x82005509u, "ULNIC_IOC_TAKE_NOTIFIED");
#define ULNIC_IOC_WATCHER _IOW(ULNIC_IOC_TYPE, 10, __u32)
_Static_assert(ULNIC_IOC_WATCHER == 0x4004550au, "ULNIC_IOC_WATCHER");
#define ULNIC_IOC_WATCH _IOW(ULNIC_IOC_TYPE, 11, struct ulnic_ioc_watch)
_Static_assert(ULNIC_IOC_WATCH == 0x4010550bu, "ULNIC_IOC_WATCH");

#endif /* ULNIC_ABI_H */
