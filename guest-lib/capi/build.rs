//! Gives the shared library its soname, so programs linked against it
//! load `libulnic.so.<major>` (the install script makes the links).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libulnic.so.0");
}
