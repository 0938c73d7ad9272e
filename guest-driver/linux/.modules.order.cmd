savedcmd_/work/main/guest-driver/linux/modules.order := {   echo /work/main/guest-driver/linux/ulnic.o; :; } > /work/main/guest-driver/linux/modules.order
