#include <linux/module.h>
#include <linux/export-internal.h>
#include <linux/compiler.h>

MODULE_INFO(name, KBUILD_MODNAME);

__visible struct module __this_module
__section(".gnu.linkonce.this_module") = {
	.name = KBUILD_MODNAME,
	.init = init_module,
#ifdef CONFIG_MODULE_UNLOAD
	.exit = cleanup_module,
#endif
	.arch = MODULE_ARCH_INIT,
};



static const struct modversion_info ____versions[]
__used __section("__versions") = {
	{ 0xa6257a2f, "complete" },
	{ 0x5010963d, "unregister_virtio_driver" },
	{ 0x4dfa8d4b, "mutex_lock" },
	{ 0x43babd19, "sg_init_one" },
	{ 0x9775c49d, "virtqueue_add_sgs" },
	{ 0x3213f038, "mutex_unlock" },
	{ 0x5b8239ca, "__x86_return_thunk" },
	{ 0xf1e22506, "virtqueue_kick" },
	{ 0x4a3ad70e, "wait_for_completion_timeout" },
	{ 0x45a381fe, "virtqueue_get_buf" },
	{ 0xdb96f85a, "_dev_err" },
	{ 0x72900cd3, "virtio_break_device" },
	{ 0xf0fdf6cb, "__stack_chk_fail" },
	{ 0xade263cc, "virtqueue_add_inbuf" },
	{ 0xa1178f08, "virtio_check_driver_offered_feature" },
	{ 0xe2c17b5d, "__SCT__might_resched" },
	{ 0x76992a33, "kmalloc_caches" },
	{ 0x9fb8e114, "__kmalloc_cache_noprof" },
	{ 0xcefb0c9f, "__mutex_init" },
	{ 0x608741b5, "__init_swait_queue_head" },
	{ 0x52c5c991, "__kmalloc_noprof" },
	{ 0xe0112fc4, "__x86_indirect_thunk_r9" },
	{ 0xc780110a, "_dev_info" },
	{ 0xbdfb6dbb, "__fentry__" },
	{ 0xfb231b0f, "__register_virtio_driver" },
	{ 0x1c50c793, "virtio_reset_device" },
	{ 0x65487097, "__x86_indirect_thunk_rax" },
	{ 0x37a0cba, "kfree" },
	{ 0x5002fa32, "module_layout" },
};

MODULE_INFO(depends, "");

MODULE_ALIAS("virtio:d00000015v*");
