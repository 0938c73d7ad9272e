/work/main/guest-driver/linux/ulnic.o
