savedcmd_/work/main/guest-driver/linux/ulnic.mod := printf '%s\n'   ulnic.o | awk '!x[$$0]++ { print("/work/main/guest-driver/linux/"$$0) }' > /work/main/guest-driver/linux/ulnic.mod
