//! A writer for the cpio "newc" format the kernel unpacks as an initramfs.
//! Written here rather than depending on the cpio package: a fresh machine
//! lacks it, and the format is a fixed ASCII header per entry.

use std::io::{self, Write};

/// Builds an archive in memory.
#[derive(Default)]
pub struct Archive {
    buf: Vec<u8>,
    ino: u32,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

impl Archive {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let namesize = name.len() + 1;
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            0,
            0,
            namesize as u32,
            0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    /// Adds a directory.
    pub fn dir(&mut self, name: &str) {
        self.entry(name, S_IFDIR | 0o755, &[]);
    }

    /// Adds a regular file.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, S_IFREG | (perm & 0o7777), data);
    }

    /// Adds a symbolic link.
    pub fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, S_IFLNK | 0o777, target.as_bytes());
    }

    /// Finishes the archive and writes it.
    pub fn finish(mut self, out: &mut impl Write) -> io::Result<()> {
        self.entry("TRAILER!!!", 0, &[]);
        out.write_all(&self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_matches_newc() {
        let mut a = Archive::default();
        a.file("init", 0o755, b"#!/bin/sh\n");
        let mut out = Vec::new();
        a.finish(&mut out).unwrap();
        assert_eq!(&out[..6], b"070701");
        // mode field (second) of the first entry
        assert_eq!(&out[14..22], b"000081ed");
        // filesize field (seventh)
        assert_eq!(&out[54..62], b"0000000a");
        // name right after the 110-byte header, NUL terminated
        assert_eq!(&out[110..115], b"init\0");
        assert_eq!(out.len() % 4, 0);
        assert!(out.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
