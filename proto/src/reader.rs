//! The pieces both binary formats share: a bounds-checked cursor for decoding and a writer
//! whose record count is filled in when it finishes, so the count can never disagree with
//! the records that follow it.

use bytes::{BufMut, Bytes, BytesMut};

use crate::{DecodeError, TooLarge};

/// The only version of both binary formats.
pub const VERSION: u8 = 1;

/// Version byte and record count in front of every batch and page.
pub(crate) const PREFIX_BYTES: usize = 1 + 4;

/// A bounds-checked cursor over the input: every read names the field it wanted.
pub(crate) struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Checks the version byte and reads the record count.
    pub(crate) fn open(buf: &'a Bytes) -> Result<(Reader<'a>, usize), DecodeError> {
        let mut reader = Reader { buf, pos: 0 };
        let Some(&version) = buf.first() else {
            return Err(DecodeError::Empty);
        };
        reader.pos = 1;
        if version != VERSION {
            return Err(DecodeError::UnknownVersion(version));
        }
        let count = reader.u32("record count")? as usize;
        Ok((reader, count))
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Room for `count` items of at least `min_bytes` each, bounded by what the input can
    /// hold: a forged count is a lie, never an allocation.
    pub(crate) fn capacity_for(&self, count: usize, min_bytes: usize) -> usize {
        count.min(self.remaining() / min_bytes)
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated(field));
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let bytes = self.take(4, field)?;
        Ok(u32::from_be_bytes(bytes.try_into().expect("took 4 bytes")))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let bytes = self.take(8, field)?;
        Ok(u64::from_be_bytes(bytes.try_into().expect("took 8 bytes")))
    }

    /// A `u32` length and that many bytes, as a slice of the input.
    pub(crate) fn sized(&mut self, field: &'static str) -> Result<Bytes, DecodeError> {
        let len = self.u32(field)? as usize;
        if self.remaining() < len {
            return Err(DecodeError::Truncated(field));
        }
        let bytes = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(bytes)
    }

    /// A header list: `u32 count | count × (u32 len, name, u32 len, value)`, UTF-8 checked.
    pub(crate) fn headers(&mut self) -> Result<Vec<(Bytes, Bytes)>, DecodeError> {
        let count = self.u32("header count")? as usize;
        let mut headers = Vec::with_capacity(self.capacity_for(count, 8));
        for _ in 0..count {
            let name = self.sized("header name")?;
            let value = self.sized("header value")?;
            if std::str::from_utf8(&name).is_err() || std::str::from_utf8(&value).is_err() {
                return Err(DecodeError::InvalidUtf8);
            }
            headers.push((name, value));
        }
        Ok(headers)
    }
}

/// Builds a batch or a page; [`Writer::finish`] writes the count of records added.
pub(crate) struct Writer {
    out: BytesMut,
    count: u32,
}

impl Writer {
    pub(crate) fn with_capacity(bytes: usize) -> Writer {
        let mut out = BytesMut::with_capacity(PREFIX_BYTES + bytes);
        out.put_u8(VERSION);
        out.put_u32(0);
        Writer { out, count: 0 }
    }

    /// Counts one more record; its fields follow.
    pub(crate) fn start_record(&mut self) -> Result<&mut BytesMut, TooLarge> {
        self.count = self.count.checked_add(1).ok_or(TooLarge("record count"))?;
        Ok(&mut self.out)
    }

    pub(crate) fn finish(mut self) -> Bytes {
        self.out[1..PREFIX_BYTES].copy_from_slice(&self.count.to_be_bytes());
        self.out.freeze()
    }
}

pub(crate) fn len_u32(len: usize, what: &'static str) -> Result<u32, TooLarge> {
    u32::try_from(len).map_err(|_| TooLarge(what))
}

pub(crate) fn put_sized(
    out: &mut BytesMut,
    bytes: &[u8],
    what: &'static str,
) -> Result<(), TooLarge> {
    out.put_u32(len_u32(bytes.len(), what)?);
    out.put_slice(bytes);
    Ok(())
}

pub(crate) fn put_headers<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    out: &mut BytesMut,
    headers: &[(N, V)],
) -> Result<(), TooLarge> {
    out.put_u32(len_u32(headers.len(), "header count")?);
    for (name, value) in headers {
        put_sized(out, name.as_ref(), "header name")?;
        put_sized(out, value.as_ref(), "header value")?;
    }
    Ok(())
}

pub(crate) fn headers_len<N: AsRef<[u8]>, V: AsRef<[u8]>>(headers: &[(N, V)]) -> usize {
    headers
        .iter()
        .map(|(n, v)| 8 + n.as_ref().len() + v.as_ref().len())
        .sum()
}
