//! A bounds-checked reader for the small binary values the filter keeps in shared data.
//!
//! Every read returns `None` past the end instead of panicking: shared data can hold anything a
//! crashed or older filter wrote, and a bad value must read as "nothing", never trap the VM.

/// Reads little-endian values from the front of a byte slice.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, r) = self.0.split_at(n);
        self.0 = r;
        Some(h)
    }

    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    pub fn f32(&mut self) -> Option<f32> {
        self.array().map(f32::from_le_bytes)
    }

    pub fn f64(&mut self) -> Option<f64> {
        self.array().map(f64::from_le_bytes)
    }

    /// A `len u8 | UTF-8 bytes` string.
    pub fn str8(&mut self) -> Option<&'a str> {
        let len = usize::from(self.u8()?);
        std::str::from_utf8(self.take(len)?).ok()
    }

    /// Whether every byte was read.
    pub fn done(&self) -> bool {
        self.0.is_empty()
    }
}
