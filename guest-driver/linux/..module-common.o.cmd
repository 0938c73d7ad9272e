savedcmd_/work/main/guest-driver/linux/.module-common.o :=  x86_64-linux-gnu-gcc-12 -Wp,-MMD,/work/main/guest-driver/linux/..module-common.o.d -nostdinc -I/root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include -I./arch/x86/include/generated -I/root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include -I./include -I/root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi -I./arch/x86/include/generated/uapi -I/root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi -I./include/generated/uapi -include /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/compiler-version.h -include /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kconfig.h -include /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/compiler_types.h -D__KERNEL__ -fmacro-prefix-map=/root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/= -Wundef -DKBUILD_EXTRA_WARN1 -std=gnu11 -fshort-wchar -funsigned-char -fno-common -fno-PIE -fno-strict-aliasing -mno-sse -mno-mmx -mno-sse2 -mno-3dnow -mno-avx -fcf-protection=branch -fno-jump-tables -m64 -falign-jumps=1 -falign-loops=1 -mno-80387 -mno-fp-ret-in-387 -mpreferred-stack-boundary=3 -mskip-rax-setup -mtune=generic -mno-red-zone -mcmodel=kernel -Wno-sign-compare -fno-asynchronous-unwind-tables -mindirect-branch=thunk-extern -mindirect-branch-register -mindirect-branch-cs-prefix -mfunction-return=thunk-extern -fno-jump-tables -mharden-sls=all -fpatchable-function-entry=16,16 -fno-delete-null-pointer-checks -O2 -fno-allow-store-data-races -fstack-protector-strong -ftrivial-auto-var-init=zero -fno-stack-clash-protection -pg -mrecord-mcount -mfentry -DCC_USING_FENTRY -falign-functions=16 -fno-strict-overflow -fno-stack-check -fconserve-stack -fno-builtin-wcslen -fno-builtin-wcslen -Wall -Wextra -Wundef -Werror=implicit-function-declaration -Werror=implicit-int -Werror=return-type -Werror=strict-prototypes -Wno-format-security -Wno-trigraphs -Wno-frame-address -Wno-address-of-packed-member -Wmissing-declarations -Wmissing-prototypes -Wframe-larger-than=2048 -Wno-main -Wno-dangling-pointer -Wvla -Wno-pointer-sign -Wcast-function-type -Wno-array-bounds -Wno-stringop-overflow -Wno-alloc-size-larger-than -Wimplicit-fallthrough=5 -Werror=date-time -Werror=incompatible-pointer-types -Werror=designated-init -Wenum-conversion -Wunused -Wmissing-format-attribute -Wmissing-include-dirs -Wunused-const-variable -Wno-missing-field-initializers -Wno-type-limits -Wno-shift-negative-value -Wno-maybe-uninitialized -Wno-sign-compare -Wno-unused-parameter -g -DMODULE -DKBUILD_BASENAME='".module_common"' -DKBUILD_MODNAME='".module_common.o"' -D__KBUILD_MODNAME=kmod_.module_common.o -c -o /work/main/guest-driver/linux/.module-common.o /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/scripts/module-common.c

source_/work/main/guest-driver/linux/.module-common.o := /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/scripts/module-common.c

deps_/work/main/guest-driver/linux/.module-common.o := \
    $(wildcard include/config/UNWINDER_ORC) \
    $(wildcard include/config/MITIGATION_RETPOLINE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/compiler-version.h \
    $(wildcard include/config/CC_VERSION_TEXT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kconfig.h \
    $(wildcard include/config/CPU_BIG_ENDIAN) \
    $(wildcard include/config/BOOGER) \
    $(wildcard include/config/FOO) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/compiler_types.h \
    $(wildcard include/config/DEBUG_INFO_BTF) \
    $(wildcard include/config/PAHOLE_HAS_BTF_TAG) \
    $(wildcard include/config/FUNCTION_ALIGNMENT) \
    $(wildcard include/config/CC_HAS_SANE_FUNCTION_ALIGNMENT) \
    $(wildcard include/config/X86_64) \
    $(wildcard include/config/ARM64) \
    $(wildcard include/config/LD_DEAD_CODE_DATA_ELIMINATION) \
    $(wildcard include/config/LTO_CLANG) \
    $(wildcard include/config/HAVE_ARCH_COMPILER_H) \
    $(wildcard include/config/KCSAN) \
    $(wildcard include/config/CC_HAS_COUNTED_BY) \
    $(wildcard include/config/UBSAN_SIGNED_WRAP) \
    $(wildcard include/config/CC_HAS_ASM_INLINE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/compiler_attributes.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/compiler-gcc.h \
    $(wildcard include/config/ARCH_USE_BUILTIN_BSWAP) \
    $(wildcard include/config/SHADOW_CALL_STACK) \
    $(wildcard include/config/KCOV) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/module.h \
    $(wildcard include/config/MODULES) \
    $(wildcard include/config/SYSFS) \
    $(wildcard include/config/MODULES_TREE_LOOKUP) \
    $(wildcard include/config/LIVEPATCH) \
    $(wildcard include/config/STACKTRACE_BUILD_ID) \
    $(wildcard include/config/ARCH_USES_CFI_TRAPS) \
    $(wildcard include/config/MODULE_SIG) \
    $(wildcard include/config/GENERIC_BUG) \
    $(wildcard include/config/KALLSYMS) \
    $(wildcard include/config/SMP) \
    $(wildcard include/config/TRACEPOINTS) \
    $(wildcard include/config/TREE_SRCU) \
    $(wildcard include/config/BPF_EVENTS) \
    $(wildcard include/config/DEBUG_INFO_BTF_MODULES) \
    $(wildcard include/config/JUMP_LABEL) \
    $(wildcard include/config/TRACING) \
    $(wildcard include/config/EVENT_TRACING) \
    $(wildcard include/config/FTRACE_MCOUNT_RECORD) \
    $(wildcard include/config/KPROBES) \
    $(wildcard include/config/HAVE_STATIC_CALL_INLINE) \
    $(wildcard include/config/KUNIT) \
    $(wildcard include/config/PRINTK_INDEX) \
    $(wildcard include/config/MODULE_UNLOAD) \
    $(wildcard include/config/MITIGATION_ITS) \
    $(wildcard include/config/CONSTRUCTORS) \
    $(wildcard include/config/FUNCTION_ERROR_INJECTION) \
    $(wildcard include/config/DYNAMIC_DEBUG_CORE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/list.h \
    $(wildcard include/config/LIST_HARDENED) \
    $(wildcard include/config/DEBUG_LIST) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/container_of.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/build_bug.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/compiler.h \
    $(wildcard include/config/TRACE_BRANCH_PROFILING) \
    $(wildcard include/config/PROFILE_ALL_BRANCHES) \
    $(wildcard include/config/OBJTOOL) \
    $(wildcard include/config/64BIT) \
  arch/x86/include/generated/asm/rwonce.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/rwonce.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kasan-checks.h \
    $(wildcard include/config/KASAN_GENERIC) \
    $(wildcard include/config/KASAN_SW_TAGS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/types.h \
    $(wildcard include/config/HAVE_UID16) \
    $(wildcard include/config/UID16) \
    $(wildcard include/config/ARCH_DMA_ADDR_T_64BIT) \
    $(wildcard include/config/PHYS_ADDR_T_64BIT) \
    $(wildcard include/config/ARCH_32BIT_USTAT_F_TINODE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/types.h \
  arch/x86/include/generated/uapi/asm/types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/int-ll64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/int-ll64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/bitsperlong.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bitsperlong.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/bitsperlong.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/posix_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/stddef.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/stddef.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/posix_types.h \
    $(wildcard include/config/X86_32) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/posix_types_64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/posix_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kcsan-checks.h \
    $(wildcard include/config/KCSAN_WEAK_MEMORY) \
    $(wildcard include/config/KCSAN_IGNORE_ATOMICS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/poison.h \
    $(wildcard include/config/ILLEGAL_POINTER_VALUE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/const.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/vdso/const.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/const.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/barrier.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/alternative.h \
    $(wildcard include/config/CALL_THUNKS) \
    $(wildcard include/config/MITIGATION_RETHUNK) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/stringify.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/asm.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/extable_fixup_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/bug.h \
    $(wildcard include/config/DEBUG_BUGVERBOSE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/instrumentation.h \
    $(wildcard include/config/NOINSTR_VALIDATION) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/objtool.h \
    $(wildcard include/config/FRAME_POINTER) \
    $(wildcard include/config/MITIGATION_UNRET_ENTRY) \
    $(wildcard include/config/MITIGATION_SRSO) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/objtool_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bug.h \
    $(wildcard include/config/BUG) \
    $(wildcard include/config/GENERIC_BUG_RELATIVE_POINTERS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/once_lite.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/panic.h \
    $(wildcard include/config/PANIC_TIMEOUT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/printk.h \
    $(wildcard include/config/MESSAGE_LOGLEVEL_DEFAULT) \
    $(wildcard include/config/CONSOLE_LOGLEVEL_DEFAULT) \
    $(wildcard include/config/CONSOLE_LOGLEVEL_QUIET) \
    $(wildcard include/config/EARLY_PRINTK) \
    $(wildcard include/config/PRINTK) \
    $(wildcard include/config/DYNAMIC_DEBUG) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/stdarg.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/init.h \
    $(wildcard include/config/MEMORY_HOTPLUG) \
    $(wildcard include/config/HAVE_ARCH_PREL32_RELOCATIONS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kern_levels.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/linkage.h \
    $(wildcard include/config/ARCH_USE_SYM_ANNOTATIONS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/export.h \
    $(wildcard include/config/MODVERSIONS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/linkage.h \
    $(wildcard include/config/CALL_PADDING) \
    $(wildcard include/config/MITIGATION_SLS) \
    $(wildcard include/config/FUNCTION_PADDING_BYTES) \
    $(wildcard include/config/UML) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/ibt.h \
    $(wildcard include/config/X86_KERNEL_IBT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/ratelimit_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/bits.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/vdso/bits.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/bits.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/overflow.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/limits.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/limits.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/vdso/limits.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/param.h \
  arch/x86/include/generated/uapi/asm/param.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/param.h \
    $(wildcard include/config/HZ) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/param.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/spinlock_types_raw.h \
    $(wildcard include/config/DEBUG_SPINLOCK) \
    $(wildcard include/config/DEBUG_LOCK_ALLOC) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/spinlock_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/qspinlock_types.h \
    $(wildcard include/config/NR_CPUS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/qrwlock_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/byteorder.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/byteorder/little_endian.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/byteorder/little_endian.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/swab.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/swab.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/swab.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/byteorder/generic.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/lockdep_types.h \
    $(wildcard include/config/PROVE_RAW_LOCK_NESTING) \
    $(wildcard include/config/LOCKDEP) \
    $(wildcard include/config/LOCK_STAT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/dynamic_debug.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/jump_label.h \
    $(wildcard include/config/HAVE_ARCH_JUMP_LABEL_RELATIVE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/jump_label.h \
    $(wildcard include/config/HAVE_JUMP_LABEL_HACK) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/nops.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/barrier.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/stat.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/stat.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/stat.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/time.h \
    $(wildcard include/config/POSIX_TIMERS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/cache.h \
    $(wildcard include/config/ARCH_HAS_CACHE_LINE_SIZE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/kernel.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/sysinfo.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/cache.h \
    $(wildcard include/config/X86_L1_CACHE_SHIFT) \
    $(wildcard include/config/X86_INTERNODE_CACHE_SHIFT) \
    $(wildcard include/config/X86_VSMP) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/math64.h \
    $(wildcard include/config/ARCH_SUPPORTS_INT128) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/math.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/div64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/div64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/vdso/math64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/time64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/vdso/time64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/time.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/time_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/time32.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/timex.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/timex.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/timex.h \
    $(wildcard include/config/X86_TSC) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/processor.h \
    $(wildcard include/config/X86_VMX_FEATURE_NAMES) \
    $(wildcard include/config/X86_IOPL_IOPERM) \
    $(wildcard include/config/STACKPROTECTOR) \
    $(wildcard include/config/VM86) \
    $(wildcard include/config/X86_USER_SHADOW_STACK) \
    $(wildcard include/config/USE_X86_SEG_SUPPORT) \
    $(wildcard include/config/PARAVIRT_XXL) \
    $(wildcard include/config/CPU_SUP_AMD) \
    $(wildcard include/config/XEN) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/processor-flags.h \
    $(wildcard include/config/MITIGATION_PAGE_TABLE_ISOLATION) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/processor-flags.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mem_encrypt.h \
    $(wildcard include/config/ARCH_HAS_MEM_ENCRYPT) \
    $(wildcard include/config/AMD_MEM_ENCRYPT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/mem_encrypt.h \
    $(wildcard include/config/X86_MEM_ENCRYPT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/cc_platform.h \
    $(wildcard include/config/ARCH_HAS_CC_PLATFORM) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/math_emu.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/ptrace.h \
    $(wildcard include/config/PARAVIRT) \
    $(wildcard include/config/IA32_EMULATION) \
    $(wildcard include/config/X86_DEBUGCTLMSR) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/segment.h \
    $(wildcard include/config/XEN_PV) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/page_types.h \
    $(wildcard include/config/PAGE_SHIFT) \
    $(wildcard include/config/PHYSICAL_START) \
    $(wildcard include/config/PHYSICAL_ALIGN) \
    $(wildcard include/config/DYNAMIC_PHYSICAL_MASK) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/page_64_types.h \
    $(wildcard include/config/KASAN) \
    $(wildcard include/config/DYNAMIC_MEMORY_LAYOUT) \
    $(wildcard include/config/X86_5LEVEL) \
    $(wildcard include/config/RANDOMIZE_BASE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/kaslr.h \
    $(wildcard include/config/RANDOMIZE_MEMORY) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/ptrace.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/ptrace-abi.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/paravirt_types.h \
    $(wildcard include/config/PGTABLE_LEVELS) \
    $(wildcard include/config/ZERO_CALL_USED_REGS) \
    $(wildcard include/config/PARAVIRT_DEBUG) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/desc_defs.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/pgtable_types.h \
    $(wildcard include/config/X86_INTEL_MEMORY_PROTECTION_KEYS) \
    $(wildcard include/config/X86_PAE) \
    $(wildcard include/config/MEM_SOFT_DIRTY) \
    $(wildcard include/config/HAVE_ARCH_USERFAULTFD_WP) \
    $(wildcard include/config/PROC_FS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/pgtable_64_types.h \
    $(wildcard include/config/KMSAN) \
    $(wildcard include/config/DEBUG_KMAP_LOCAL_FORCE_MAP) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/sparsemem.h \
    $(wildcard include/config/SPARSEMEM) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/nospec-branch.h \
    $(wildcard include/config/CALL_THUNKS_DEBUG) \
    $(wildcard include/config/MITIGATION_CALL_DEPTH_TRACKING) \
    $(wildcard include/config/MITIGATION_IBPB_ENTRY) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/static_key.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/cpufeatures.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/required-features.h \
    $(wildcard include/config/X86_MINIMUM_CPU_FAMILY) \
    $(wildcard include/config/MATH_EMULATION) \
    $(wildcard include/config/X86_CMPXCHG64) \
    $(wildcard include/config/X86_CMOV) \
    $(wildcard include/config/X86_P6_NOP) \
    $(wildcard include/config/MATOM) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/disabled-features.h \
    $(wildcard include/config/X86_UMIP) \
    $(wildcard include/config/ADDRESS_MASKING) \
    $(wildcard include/config/INTEL_IOMMU_SVM) \
    $(wildcard include/config/X86_SGX) \
    $(wildcard include/config/INTEL_TDX_GUEST) \
    $(wildcard include/config/X86_FRED) \
    $(wildcard include/config/KVM_AMD_SEV) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/msr-index.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/unwind_hints.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/orc_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/percpu.h \
    $(wildcard include/config/X86_64_SMP) \
    $(wildcard include/config/CC_HAS_NAMED_AS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/percpu.h \
    $(wildcard include/config/DEBUG_PREEMPT) \
    $(wildcard include/config/HAVE_SETUP_PER_CPU_AREA) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/threads.h \
    $(wildcard include/config/BASE_SMALL) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/percpu-defs.h \
    $(wildcard include/config/DEBUG_FORCE_WEAK_PER_CPU) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/current.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/asm-offsets.h \
  include/generated/asm-offsets.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/GEN-for-each-reg.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/proto.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/ldt.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/sigcontext.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/cpuid.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/string.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/string_64.h \
    $(wildcard include/config/ARCH_HAS_UACCESS_FLUSHCACHE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/paravirt.h \
    $(wildcard include/config/PARAVIRT_SPINLOCKS) \
    $(wildcard include/config/DEBUG_ENTRY) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/bug.h \
    $(wildcard include/config/BUG_ON_DATA_CORRUPTION) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/cpumask.h \
    $(wildcard include/config/FORCE_NR_CPUS) \
    $(wildcard include/config/HOTPLUG_CPU) \
    $(wildcard include/config/DEBUG_PER_CPU_MAPS) \
    $(wildcard include/config/CPUMASK_OFFSTACK) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/cleanup.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kernel.h \
    $(wildcard include/config/PREEMPT_VOLUNTARY_BUILD) \
    $(wildcard include/config/PREEMPT_DYNAMIC) \
    $(wildcard include/config/HAVE_PREEMPT_DYNAMIC_CALL) \
    $(wildcard include/config/HAVE_PREEMPT_DYNAMIC_KEY) \
    $(wildcard include/config/PREEMPT_) \
    $(wildcard include/config/DEBUG_ATOMIC_SLEEP) \
    $(wildcard include/config/MMU) \
    $(wildcard include/config/PROVE_LOCKING) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/align.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/array_size.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/bitops.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/typecheck.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bitops/generic-non-atomic.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/bitops.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/rmwcc.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/args.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bitops/sched.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/arch_hweight.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bitops/const_hweight.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bitops/instrumented-atomic.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/instrumented.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kmsan-checks.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bitops/instrumented-non-atomic.h \
    $(wildcard include/config/KCSAN_ASSUME_PLAIN_WRITES_ATOMIC) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bitops/instrumented-lock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bitops/le.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/bitops/ext2-atomic-setbit.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/hex.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kstrtox.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/log2.h \
    $(wildcard include/config/ARCH_HAS_ILOG2_U32) \
    $(wildcard include/config/ARCH_HAS_ILOG2_U64) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/minmax.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sprintf.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/static_call_types.h \
    $(wildcard include/config/HAVE_STATIC_CALL) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/instruction_pointer.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/wordpart.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/bitmap.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/errno.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/errno.h \
  arch/x86/include/generated/uapi/asm/errno.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/errno.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/errno-base.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/find.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/string.h \
    $(wildcard include/config/BINARY_PRINTF) \
    $(wildcard include/config/FORTIFY_SOURCE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/err.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/string.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/fortify-string.h \
    $(wildcard include/config/CC_HAS_KASAN_MEMINTRINSIC_PREFIX) \
    $(wildcard include/config/GENERIC_ENTRY) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/bitfield.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/bitmap-str.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/cpumask_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/atomic.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/atomic.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/cmpxchg.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/cmpxchg_64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/atomic64_64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/atomic/atomic-arch-fallback.h \
    $(wildcard include/config/GENERIC_ATOMIC64) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/atomic/atomic-long.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/atomic/atomic-instrumented.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/gfp_types.h \
    $(wildcard include/config/KASAN_HW_TAGS) \
    $(wildcard include/config/SLAB_OBJ_EXT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/numa.h \
    $(wildcard include/config/NODES_SHIFT) \
    $(wildcard include/config/NUMA_KEEP_MEMINFO) \
    $(wildcard include/config/NUMA) \
    $(wildcard include/config/HAVE_ARCH_NODE_DEV_GROUP) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/frame.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/page.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/page_64.h \
    $(wildcard include/config/DEBUG_VIRTUAL) \
    $(wildcard include/config/X86_VSYSCALL_EMULATION) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/range.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/memory_model.h \
    $(wildcard include/config/FLATMEM) \
    $(wildcard include/config/SPARSEMEM_VMEMMAP) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/pfn.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/getorder.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/special_insns.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/irqflags.h \
    $(wildcard include/config/TRACE_IRQFLAGS) \
    $(wildcard include/config/PREEMPT_RT) \
    $(wildcard include/config/IRQSOFF_TRACER) \
    $(wildcard include/config/PREEMPT_TRACER) \
    $(wildcard include/config/DEBUG_IRQFLAGS) \
    $(wildcard include/config/TRACE_IRQFLAGS_SUPPORT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/irqflags_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/irqflags.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/fpu/types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/vmxfeatures.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/vdso/processor.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/shstk.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/personality.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/personality.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/tsc.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/cpufeature.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/msr.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/cpumask.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/msr.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/ioctl.h \
  arch/x86/include/generated/uapi/asm/ioctl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/ioctl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/ioctl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/shared/msr.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/percpu.h \
    $(wildcard include/config/MEM_ALLOC_PROFILING) \
    $(wildcard include/config/RANDOM_KMALLOC_CACHES) \
    $(wildcard include/config/PAGE_SIZE_4KB) \
    $(wildcard include/config/NEED_PER_CPU_PAGE_FIRST_CHUNK) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/alloc_tag.h \
    $(wildcard include/config/MEM_ALLOC_PROFILING_DEBUG) \
    $(wildcard include/config/MEM_ALLOC_PROFILING_ENABLED_BY_DEFAULT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/codetag.h \
    $(wildcard include/config/CODE_TAGGING) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/preempt.h \
    $(wildcard include/config/PREEMPT_COUNT) \
    $(wildcard include/config/TRACE_PREEMPT_TOGGLE) \
    $(wildcard include/config/PREEMPTION) \
    $(wildcard include/config/PREEMPT_NOTIFIERS) \
    $(wildcard include/config/PREEMPT_NONE) \
    $(wildcard include/config/PREEMPT_VOLUNTARY) \
    $(wildcard include/config/PREEMPT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/preempt.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/smp.h \
    $(wildcard include/config/UP_LATE_INIT) \
    $(wildcard include/config/CSD_LOCK_WAIT_DEBUG) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/smp_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/llist.h \
    $(wildcard include/config/ARCH_HAVE_NMI_SAFE_CMPXCHG) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/thread_info.h \
    $(wildcard include/config/THREAD_INFO_IN_TASK) \
    $(wildcard include/config/HAVE_ARCH_WITHIN_STACK_FRAMES) \
    $(wildcard include/config/HARDENED_USERCOPY) \
    $(wildcard include/config/SH) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/restart_block.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/thread_info.h \
    $(wildcard include/config/COMPAT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/smp.h \
    $(wildcard include/config/DEBUG_NMI_SELFTEST) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mmdebug.h \
    $(wildcard include/config/DEBUG_VM) \
    $(wildcard include/config/DEBUG_VM_IRQSOFF) \
    $(wildcard include/config/DEBUG_VM_PGFLAGS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched.h \
    $(wildcard include/config/VIRT_CPU_ACCOUNTING_NATIVE) \
    $(wildcard include/config/SCHED_INFO) \
    $(wildcard include/config/SCHEDSTATS) \
    $(wildcard include/config/SCHED_CORE) \
    $(wildcard include/config/FAIR_GROUP_SCHED) \
    $(wildcard include/config/RT_GROUP_SCHED) \
    $(wildcard include/config/RT_MUTEXES) \
    $(wildcard include/config/UCLAMP_TASK) \
    $(wildcard include/config/UCLAMP_BUCKETS_COUNT) \
    $(wildcard include/config/KMAP_LOCAL) \
    $(wildcard include/config/SCHED_CLASS_EXT) \
    $(wildcard include/config/CGROUP_SCHED) \
    $(wildcard include/config/BLK_DEV_IO_TRACE) \
    $(wildcard include/config/PREEMPT_RCU) \
    $(wildcard include/config/TASKS_RCU) \
    $(wildcard include/config/TASKS_TRACE_RCU) \
    $(wildcard include/config/MEMCG_V1) \
    $(wildcard include/config/LRU_GEN) \
    $(wildcard include/config/COMPAT_BRK) \
    $(wildcard include/config/CGROUPS) \
    $(wildcard include/config/BLK_CGROUP) \
    $(wildcard include/config/PSI) \
    $(wildcard include/config/PAGE_OWNER) \
    $(wildcard include/config/EVENTFD) \
    $(wildcard include/config/ARCH_HAS_CPU_PASID) \
    $(wildcard include/config/CPU_SUP_INTEL) \
    $(wildcard include/config/TASK_DELAY_ACCT) \
    $(wildcard include/config/ARCH_HAS_SCALED_CPUTIME) \
    $(wildcard include/config/VIRT_CPU_ACCOUNTING_GEN) \
    $(wildcard include/config/NO_HZ_FULL) \
    $(wildcard include/config/POSIX_CPUTIMERS) \
    $(wildcard include/config/POSIX_CPU_TIMERS_TASK_WORK) \
    $(wildcard include/config/KEYS) \
    $(wildcard include/config/SYSVIPC) \
    $(wildcard include/config/DETECT_HUNG_TASK) \
    $(wildcard include/config/IO_URING) \
    $(wildcard include/config/AUDIT) \
    $(wildcard include/config/AUDITSYSCALL) \
    $(wildcard include/config/DEBUG_MUTEXES) \
    $(wildcard include/config/UBSAN) \
    $(wildcard include/config/UBSAN_TRAP) \
    $(wildcard include/config/COMPACTION) \
    $(wildcard include/config/TASK_XACCT) \
    $(wildcard include/config/CPUSETS) \
    $(wildcard include/config/X86_CPU_RESCTRL) \
    $(wildcard include/config/FUTEX) \
    $(wildcard include/config/PERF_EVENTS) \
    $(wildcard include/config/NUMA_BALANCING) \
    $(wildcard include/config/RSEQ) \
    $(wildcard include/config/SCHED_MM_CID) \
    $(wildcard include/config/FAULT_INJECTION) \
    $(wildcard include/config/LATENCYTOP) \
    $(wildcard include/config/FUNCTION_GRAPH_TRACER) \
    $(wildcard include/config/MEMCG) \
    $(wildcard include/config/UPROBES) \
    $(wildcard include/config/BCACHE) \
    $(wildcard include/config/VMAP_STACK) \
    $(wildcard include/config/SECURITY) \
    $(wildcard include/config/BPF_SYSCALL) \
    $(wildcard include/config/GCC_PLUGIN_STACKLEAK) \
    $(wildcard include/config/RANDOMIZE_KSTACK_OFFSET) \
    $(wildcard include/config/X86_MCE) \
    $(wildcard include/config/KRETPROBES) \
    $(wildcard include/config/RETHOOK) \
    $(wildcard include/config/ARCH_HAS_PARANOID_L1D_FLUSH) \
    $(wildcard include/config/RV) \
    $(wildcard include/config/USER_EVENTS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/sched.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/pid_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sem_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/shm.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/shmparam.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kmsan_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mutex_types.h \
    $(wildcard include/config/MUTEX_SPIN_ON_OWNER) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/osq_lock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/spinlock_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rwlock_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/plist_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/hrtimer_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/timerqueue_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rbtree_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/timer_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/seccomp_types.h \
    $(wildcard include/config/SECCOMP) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/nodemask_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/refcount_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/resource.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/resource.h \
  arch/x86/include/generated/uapi/asm/resource.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/resource.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/resource.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/latencytop.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/prio.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/signal_types.h \
    $(wildcard include/config/OLD_SIGACTION) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/signal.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/signal.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/signal.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/signal-defs.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/siginfo.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/siginfo.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/syscall_user_dispatch_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mm_types_task.h \
    $(wildcard include/config/ARCH_WANT_BATCHED_UNMAP_TLB_FLUSH) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/tlbbatch.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/netdevice_xmit.h \
    $(wildcard include/config/NET_ACT_MIRRED) \
    $(wildcard include/config/NET_EGRESS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/task_io_accounting.h \
    $(wildcard include/config/TASK_IO_ACCOUNTING) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/posix-timers_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/rseq.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/seqlock_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kcsan.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rv.h \
    $(wildcard include/config/RV_REACTORS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/livepatch_sched.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/uidgid_types.h \
  arch/x86/include/generated/asm/kmap_size.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/kmap_size.h \
    $(wildcard include/config/DEBUG_KMAP_LOCAL) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/ext.h \
    $(wildcard include/config/EXT_GROUP_SCHED) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/spinlock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/bottom_half.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/lockdep.h \
    $(wildcard include/config/DEBUG_LOCKING_API_SELFTESTS) \
  arch/x86/include/generated/asm/mmiowb.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/mmiowb.h \
    $(wildcard include/config/MMIOWB) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/spinlock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/qspinlock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/qspinlock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/qrwlock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/qrwlock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rwlock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/spinlock_api_smp.h \
    $(wildcard include/config/INLINE_SPIN_LOCK) \
    $(wildcard include/config/INLINE_SPIN_LOCK_BH) \
    $(wildcard include/config/INLINE_SPIN_LOCK_IRQ) \
    $(wildcard include/config/INLINE_SPIN_LOCK_IRQSAVE) \
    $(wildcard include/config/INLINE_SPIN_TRYLOCK) \
    $(wildcard include/config/INLINE_SPIN_TRYLOCK_BH) \
    $(wildcard include/config/UNINLINE_SPIN_UNLOCK) \
    $(wildcard include/config/INLINE_SPIN_UNLOCK_BH) \
    $(wildcard include/config/INLINE_SPIN_UNLOCK_IRQ) \
    $(wildcard include/config/INLINE_SPIN_UNLOCK_IRQRESTORE) \
    $(wildcard include/config/GENERIC_LOCKBREAK) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rwlock_api_smp.h \
    $(wildcard include/config/INLINE_READ_LOCK) \
    $(wildcard include/config/INLINE_WRITE_LOCK) \
    $(wildcard include/config/INLINE_READ_LOCK_BH) \
    $(wildcard include/config/INLINE_WRITE_LOCK_BH) \
    $(wildcard include/config/INLINE_READ_LOCK_IRQ) \
    $(wildcard include/config/INLINE_WRITE_LOCK_IRQ) \
    $(wildcard include/config/INLINE_READ_LOCK_IRQSAVE) \
    $(wildcard include/config/INLINE_WRITE_LOCK_IRQSAVE) \
    $(wildcard include/config/INLINE_READ_TRYLOCK) \
    $(wildcard include/config/INLINE_WRITE_TRYLOCK) \
    $(wildcard include/config/INLINE_READ_UNLOCK) \
    $(wildcard include/config/INLINE_WRITE_UNLOCK) \
    $(wildcard include/config/INLINE_READ_UNLOCK_BH) \
    $(wildcard include/config/INLINE_WRITE_UNLOCK_BH) \
    $(wildcard include/config/INLINE_READ_UNLOCK_IRQ) \
    $(wildcard include/config/INLINE_WRITE_UNLOCK_IRQ) \
    $(wildcard include/config/INLINE_READ_UNLOCK_IRQRESTORE) \
    $(wildcard include/config/INLINE_WRITE_UNLOCK_IRQRESTORE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/tracepoint-defs.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/vdso/time32.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/vdso/time.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/uidgid.h \
    $(wildcard include/config/MULTIUSER) \
    $(wildcard include/config/USER_NS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/highuid.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/buildid.h \
    $(wildcard include/config/VMCORE_INFO) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kmod.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/umh.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/gfp.h \
    $(wildcard include/config/HIGHMEM) \
    $(wildcard include/config/ZONE_DMA) \
    $(wildcard include/config/ZONE_DMA32) \
    $(wildcard include/config/ZONE_DEVICE) \
    $(wildcard include/config/CONTIG_ALLOC) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mmzone.h \
    $(wildcard include/config/ARCH_FORCE_MAX_ORDER) \
    $(wildcard include/config/CMA) \
    $(wildcard include/config/MEMORY_ISOLATION) \
    $(wildcard include/config/ZSMALLOC) \
    $(wildcard include/config/UNACCEPTED_MEMORY) \
    $(wildcard include/config/IOMMU_SUPPORT) \
    $(wildcard include/config/SWAP) \
    $(wildcard include/config/TRANSPARENT_HUGEPAGE) \
    $(wildcard include/config/LRU_GEN_STATS) \
    $(wildcard include/config/LRU_GEN_WALKS_MMU) \
    $(wildcard include/config/MEMORY_FAILURE) \
    $(wildcard include/config/PAGE_EXTENSION) \
    $(wildcard include/config/DEFERRED_STRUCT_PAGE_INIT) \
    $(wildcard include/config/HAVE_MEMORYLESS_NODES) \
    $(wildcard include/config/SPARSEMEM_EXTREME) \
    $(wildcard include/config/HAVE_ARCH_PFN_VALID) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/list_nulls.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/wait.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/seqlock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mutex.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/debug_locks.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/nodemask.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/random.h \
    $(wildcard include/config/VMGENID) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/random.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/irqnr.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/irqnr.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/prandom.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/once.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/pageblock-flags.h \
    $(wildcard include/config/HUGETLB_PAGE) \
    $(wildcard include/config/HUGETLB_PAGE_SIZE_VARIABLE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/page-flags-layout.h \
  include/generated/bounds.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mm_types.h \
    $(wildcard include/config/HAVE_ALIGNED_STRUCT_PAGE) \
    $(wildcard include/config/HUGETLB_PMD_PAGE_TABLE_SHARING) \
    $(wildcard include/config/USERFAULTFD) \
    $(wildcard include/config/ANON_VMA_NAME) \
    $(wildcard include/config/PER_VMA_LOCK) \
    $(wildcard include/config/HAVE_ARCH_COMPAT_MMAP_BASES) \
    $(wildcard include/config/MEMBARRIER) \
    $(wildcard include/config/AIO) \
    $(wildcard include/config/MMU_NOTIFIER) \
    $(wildcard include/config/SPLIT_PMD_PTLOCKS) \
    $(wildcard include/config/IOMMU_MM_DATA) \
    $(wildcard include/config/KSM) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/auxvec.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/auxvec.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/auxvec.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kref.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/refcount.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rbtree.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rcupdate.h \
    $(wildcard include/config/TINY_RCU) \
    $(wildcard include/config/RCU_STRICT_GRACE_PERIOD) \
    $(wildcard include/config/RCU_LAZY) \
    $(wildcard include/config/TASKS_RCU_GENERIC) \
    $(wildcard include/config/RCU_STALL_COMMON) \
    $(wildcard include/config/KVM_XFER_TO_GUEST_WORK) \
    $(wildcard include/config/RCU_NOCB_CPU) \
    $(wildcard include/config/TASKS_RUDE_RCU) \
    $(wildcard include/config/TREE_RCU) \
    $(wildcard include/config/DEBUG_OBJECTS_RCU_HEAD) \
    $(wildcard include/config/PROVE_RCU) \
    $(wildcard include/config/ARCH_WEAK_RELEASE_ACQUIRE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/context_tracking_irq.h \
    $(wildcard include/config/CONTEXT_TRACKING_IDLE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rcutree.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/maple_tree.h \
    $(wildcard include/config/MAPLE_RCU_DISABLED) \
    $(wildcard include/config/DEBUG_MAPLE_TREE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rwsem.h \
    $(wildcard include/config/RWSEM_SPIN_ON_OWNER) \
    $(wildcard include/config/DEBUG_RWSEMS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/completion.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/swait.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/uprobes.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/uprobes.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/notifier.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/srcu.h \
    $(wildcard include/config/TINY_SRCU) \
    $(wildcard include/config/NEED_SRCU_NMI_SAFE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/workqueue.h \
    $(wildcard include/config/DEBUG_OBJECTS_WORK) \
    $(wildcard include/config/FREEZER) \
    $(wildcard include/config/WQ_WATCHDOG) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/timer.h \
    $(wildcard include/config/DEBUG_OBJECTS_TIMERS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/ktime.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/jiffies.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/vdso/jiffies.h \
  include/generated/timeconst.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/vdso/ktime.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/timekeeping.h \
    $(wildcard include/config/GENERIC_CMOS_UPDATE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/clocksource_ids.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/debugobjects.h \
    $(wildcard include/config/DEBUG_OBJECTS) \
    $(wildcard include/config/DEBUG_OBJECTS_FREE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/workqueue_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rcu_segcblist.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/srcutree.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rcu_node_tree.h \
    $(wildcard include/config/RCU_FANOUT) \
    $(wildcard include/config/RCU_FANOUT_LEAF) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/percpu_counter.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/mmu.h \
    $(wildcard include/config/MODIFY_LDT_SYSCALL) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/page-flags.h \
    $(wildcard include/config/PAGE_IDLE_FLAG) \
    $(wildcard include/config/ARCH_USES_PG_ARCH_2) \
    $(wildcard include/config/ARCH_USES_PG_ARCH_3) \
    $(wildcard include/config/HUGETLB_PAGE_OPTIMIZE_VMEMMAP) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/local_lock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/local_lock_internal.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/zswap.h \
    $(wildcard include/config/ZSWAP) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/memory_hotplug.h \
    $(wildcard include/config/ARCH_HAS_ADD_PAGES) \
    $(wildcard include/config/MEMORY_HOTREMOVE) \
  arch/x86/include/generated/asm/mmzone.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/mmzone.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/topology.h \
    $(wildcard include/config/USE_PERCPU_NUMA_NODE_ID) \
    $(wildcard include/config/SCHED_SMT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/arch_topology.h \
    $(wildcard include/config/GENERIC_ARCH_TOPOLOGY) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/topology.h \
    $(wildcard include/config/X86_LOCAL_APIC) \
    $(wildcard include/config/SCHED_MC_PRIO) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/mpspec.h \
    $(wildcard include/config/EISA) \
    $(wildcard include/config/X86_MPPARSE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/mpspec_def.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/x86_init.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/apicdef.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/topology.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/cpu_smt.h \
    $(wildcard include/config/HOTPLUG_SMT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sysctl.h \
    $(wildcard include/config/SYSCTL) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/sysctl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/elf.h \
    $(wildcard include/config/ARCH_HAVE_EXTRA_ELF_NOTES) \
    $(wildcard include/config/ARCH_USE_GNU_PROPERTY) \
    $(wildcard include/config/ARCH_HAVE_ELF_PROT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/elf.h \
    $(wildcard include/config/X86_X32_ABI) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/ia32.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/compat.h \
    $(wildcard include/config/ARCH_HAS_SYSCALL_WRAPPER) \
    $(wildcard include/config/COMPAT_OLD_SIGACTION) \
    $(wildcard include/config/ODD_RT_SIGACTION) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sem.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/sem.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/ipc.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rhashtable-types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/ipc.h \
  arch/x86/include/generated/uapi/asm/ipcbuf.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/ipcbuf.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/sembuf.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/socket.h \
  arch/x86/include/generated/uapi/asm/socket.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/socket.h \
  arch/x86/include/generated/uapi/asm/sockios.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/sockios.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/sockios.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/uio.h \
    $(wildcard include/config/ARCH_HAS_COPY_MC) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/uio.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/socket.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/if.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/libc-compat.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/hdlc/ioctl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/fs.h \
    $(wildcard include/config/READ_ONLY_THP_FOR_FS) \
    $(wildcard include/config/FS_POSIX_ACL) \
    $(wildcard include/config/CGROUP_WRITEBACK) \
    $(wildcard include/config/IMA) \
    $(wildcard include/config/FILE_LOCKING) \
    $(wildcard include/config/FSNOTIFY) \
    $(wildcard include/config/FS_ENCRYPTION) \
    $(wildcard include/config/FS_VERITY) \
    $(wildcard include/config/EPOLL) \
    $(wildcard include/config/UNICODE) \
    $(wildcard include/config/QUOTA) \
    $(wildcard include/config/FS_DAX) \
    $(wildcard include/config/BLOCK) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/wait_bit.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kdev_t.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/kdev_t.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/dcache.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rculist.h \
    $(wildcard include/config/PROVE_RCU_LIST) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rculist_bl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/list_bl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/bit_spinlock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/lockref.h \
    $(wildcard include/config/ARCH_USE_CMPXCHG_LOCKREF) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/stringhash.h \
    $(wildcard include/config/DCACHE_WORD_ACCESS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/hash.h \
    $(wildcard include/config/HAVE_ARCH_HASH) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/path.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/list_lru.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/shrinker.h \
    $(wildcard include/config/SHRINKER_DEBUG) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/xarray.h \
    $(wildcard include/config/XARRAY_MULTI) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/mm.h \
    $(wildcard include/config/MMU_LAZY_TLB_REFCOUNT) \
    $(wildcard include/config/ARCH_HAS_MEMBARRIER_CALLBACKS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sync_core.h \
    $(wildcard include/config/ARCH_HAS_SYNC_CORE_BEFORE_USERMODE) \
    $(wildcard include/config/ARCH_HAS_PREPARE_SYNC_CORE_CMD) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/sync_core.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/coredump.h \
    $(wildcard include/config/CORE_DUMP_DEFAULT_ELF_HEADERS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/radix-tree.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/pid.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/capability.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/capability.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/semaphore.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/fcntl.h \
    $(wildcard include/config/ARCH_32BIT_OFF_T) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/fcntl.h \
  arch/x86/include/generated/uapi/asm/fcntl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/asm-generic/fcntl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/openat2.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/migrate_mode.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/percpu-rwsem.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rcuwait.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/signal.h \
    $(wildcard include/config/SCHED_AUTOGROUP) \
    $(wildcard include/config/BSD_PROCESS_ACCT) \
    $(wildcard include/config/TASKSTATS) \
    $(wildcard include/config/STACK_GROWSUP) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/signal.h \
    $(wildcard include/config/DYNAMIC_SIGFRAME) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/jobctl.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/task.h \
    $(wildcard include/config/HAVE_EXIT_THREAD) \
    $(wildcard include/config/ARCH_WANTS_DYNAMIC_TASK_STRUCT) \
    $(wildcard include/config/HAVE_ARCH_THREAD_STRUCT_WHITELIST) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/uaccess.h \
    $(wildcard include/config/ARCH_HAS_SUBPAGE_FAULTS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/fault-inject-usercopy.h \
    $(wildcard include/config/FAULT_INJECTION_USERCOPY) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/nospec.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/uaccess.h \
    $(wildcard include/config/CC_HAS_ASM_GOTO_OUTPUT) \
    $(wildcard include/config/CC_HAS_ASM_GOTO_TIED_OUTPUT) \
    $(wildcard include/config/X86_INTEL_USERCOPY) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mmap_lock.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/smap.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/extable.h \
    $(wildcard include/config/BPF_JIT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/tlbflush.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mmu_notifier.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/interval_tree.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/invpcid.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/pti.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/pgtable.h \
    $(wildcard include/config/DEBUG_WX) \
    $(wildcard include/config/HAVE_ARCH_TRANSPARENT_HUGEPAGE_PUD) \
    $(wildcard include/config/ARCH_HAS_PTE_DEVMAP) \
    $(wildcard include/config/ARCH_SUPPORTS_PMD_PFNMAP) \
    $(wildcard include/config/ARCH_SUPPORTS_PUD_PFNMAP) \
    $(wildcard include/config/HAVE_ARCH_SOFT_DIRTY) \
    $(wildcard include/config/ARCH_ENABLE_THP_MIGRATION) \
    $(wildcard include/config/PAGE_TABLE_CHECK) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/pkru.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/fpu/api.h \
    $(wildcard include/config/X86_DEBUG_FPU) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/coco.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/pgtable_uffd.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/page_table_check.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/pgtable_64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/fixmap.h \
    $(wildcard include/config/PROVIDE_OHCI1394_DMA_INIT) \
    $(wildcard include/config/X86_IO_APIC) \
    $(wildcard include/config/PCI_MMCONFIG) \
    $(wildcard include/config/ACPI_APEI_GHES) \
    $(wildcard include/config/INTEL_TXT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/vsyscall.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/fixmap.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/pgtable-invert.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/uaccess_64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/access_ok.h \
    $(wildcard include/config/ALTERNATE_USER_ADDRESS_SPACE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/cred.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/key.h \
    $(wildcard include/config/KEY_NOTIFICATIONS) \
    $(wildcard include/config/NET) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/assoc_array.h \
    $(wildcard include/config/ASSOCIATIVE_ARRAY) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/user.h \
    $(wildcard include/config/VFIO_PCI_ZDEV_KVM) \
    $(wildcard include/config/IOMMUFD) \
    $(wildcard include/config/WATCH_QUEUE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/ratelimit.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/posix-timers.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/alarmtimer.h \
    $(wildcard include/config/RTC_CLASS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/hrtimer.h \
    $(wildcard include/config/HIGH_RES_TIMERS) \
    $(wildcard include/config/TIME_LOW_RES) \
    $(wildcard include/config/TIMERFD) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/hrtimer_defs.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/timerqueue.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rcu_sync.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/delayed_call.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/uuid.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/errseq.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/ioprio.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/rt.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/iocontext.h \
    $(wildcard include/config/BLK_ICQ) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/ioprio.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/fs_types.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mount.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/mnt_idmapping.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/slab.h \
    $(wildcard include/config/FAILSLAB) \
    $(wildcard include/config/KFENCE) \
    $(wildcard include/config/SLUB_TINY) \
    $(wildcard include/config/SLUB_DEBUG) \
    $(wildcard include/config/SLAB_FREELIST_HARDENED) \
    $(wildcard include/config/SLAB_BUCKETS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/percpu-refcount.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kasan.h \
    $(wildcard include/config/KASAN_STACK) \
    $(wildcard include/config/KASAN_VMALLOC) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kasan-enabled.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kasan-tags.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rw_hint.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/fs.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/quota.h \
    $(wildcard include/config/QUOTA_NETLINK_INTERFACE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/dqblk_xfs.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/dqblk_v1.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/dqblk_v2.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/dqblk_qtree.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/projid.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/quota.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/aio_abi.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/unistd.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/unistd.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/uapi/asm/unistd.h \
  arch/x86/include/generated/uapi/asm/unistd_64.h \
  arch/x86/include/generated/asm/unistd_64_x32.h \
  arch/x86/include/generated/asm/unistd_32_ia32.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/compat.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sched/task_stack.h \
    $(wildcard include/config/DEBUG_STACK_USAGE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/magic.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/user32.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/compat.h \
    $(wildcard include/config/COMPAT_FOR_U64_ALIGNMENT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/syscall_wrapper.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/user.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/user_64.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/fsgsbase.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/syscall.h \
    $(wildcard include/config/X86_X32_DISABLED) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/audit.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/elf-em.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/vdso.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/uapi/linux/elf.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kobject.h \
    $(wildcard include/config/UEVENT_HELPER) \
    $(wildcard include/config/DEBUG_KOBJECT_RELEASE) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/sysfs.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kernfs.h \
    $(wildcard include/config/KERNFS) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/idr.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/kobject_ns.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/moduleparam.h \
    $(wildcard include/config/ALPHA) \
    $(wildcard include/config/PPC64) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/rbtree_latch.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/error-injection.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/error-injection.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/module.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/asm-generic/module.h \
    $(wildcard include/config/HAVE_MOD_ARCH_SPECIFIC) \
    $(wildcard include/config/MODULES_USE_ELF_REL) \
    $(wildcard include/config/MODULES_USE_ELF_RELA) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/build-salt.h \
    $(wildcard include/config/BUILD_SALT) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/elfnote.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/elfnote-lto.h \
    $(wildcard include/config/LTO) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/include/linux/vermagic.h \
    $(wildcard include/config/PREEMPT_BUILD) \
  include/generated/utsrelease.h \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/vermagic.h \
    $(wildcard include/config/M486SX) \
    $(wildcard include/config/M486) \
    $(wildcard include/config/M586) \
    $(wildcard include/config/M586TSC) \
    $(wildcard include/config/M586MMX) \
    $(wildcard include/config/MCORE2) \
    $(wildcard include/config/M686) \
    $(wildcard include/config/MPENTIUMII) \
    $(wildcard include/config/MPENTIUMIII) \
    $(wildcard include/config/MPENTIUMM) \
    $(wildcard include/config/MPENTIUM4) \
    $(wildcard include/config/MK6) \
    $(wildcard include/config/MK7) \
    $(wildcard include/config/MK8) \
    $(wildcard include/config/MELAN) \
    $(wildcard include/config/MCRUSOE) \
    $(wildcard include/config/MEFFICEON) \
    $(wildcard include/config/MWINCHIPC6) \
    $(wildcard include/config/MWINCHIP3D) \
    $(wildcard include/config/MCYRIXIII) \
    $(wildcard include/config/MVIAC3_2) \
    $(wildcard include/config/MVIAC7) \
    $(wildcard include/config/MGEODEGX1) \
    $(wildcard include/config/MGEODE_LX) \
  /root/.cache/ulnic/image/root/usr/src/linux-headers-6.12.95+deb12-common/arch/x86/include/asm/orc_header.h \
  arch/x86/include/generated/asm/orc_hash.h \

/work/main/guest-driver/linux/.module-common.o: $(deps_/work/main/guest-driver/linux/.module-common.o)

$(deps_/work/main/guest-driver/linux/.module-common.o):
