//! TensorBoard's event log, written directly: a file of TFRecords (length, masked CRC-32C of
//! the length, the bytes, masked CRC-32C of the bytes), each holding an `Event` protocol
//! buffer — the first one the file version, then one per logged scalar. Only the few fields
//! TensorBoard's scalar dashboard reads are encoded (by hand: a protobuf library for five
//! fields would be more code than this).

/// CRC-32C as TFRecord masks it.
fn masked_crc(bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(bytes);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One TFRecord around `data`.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The records of a file, checked, and the length of the whole records (a torn last record,
/// from a run killed while writing, is left out).
pub fn read_records(bytes: &[u8]) -> (Vec<&[u8]>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() >= at + 12 {
        let len_bytes = &bytes[at..at + 8];
        let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes"));
        if crc != masked_crc(len_bytes) {
            break;
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
        let Some(end) = usize::try_from(len)
            .ok()
            .and_then(|l| (at + 12).checked_add(l))
            .filter(|&e| e + 4 <= bytes.len())
        else {
            break;
        };
        let data = &bytes[at + 12..end];
        let crc = u32::from_le_bytes(bytes[end..end + 4].try_into().expect("4 bytes"));
        if crc != masked_crc(data) {
            break;
        }
        out.push(data);
        at = end + 4;
    }
    (out, at)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(field: u64, bytes: &[u8], out: &mut Vec<u8>) {
    varint(field << 3 | 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// An `Event` (wall_time = 1, step = 2, file_version = 3, summary = 5).
fn event(wall_time: f64, step: u64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = vec![0x09];
    e.extend_from_slice(&wall_time.to_le_bytes());
    varint(2 << 3, &mut e);
    varint(step, &mut e);
    body(&mut e);
    e
}

/// The first event of a file: its version.
pub fn file_version(wall_time: f64) -> Vec<u8> {
    event(wall_time, 0, |e| bytes_field(3, b"brain.Event:2", e))
}

/// An event of scalars: a `Summary` (value = 1) of `Value`s (tag = 1, simple_value = 2).
pub fn scalars(wall_time: f64, step: u64, values: &[(&str, f32)]) -> Vec<u8> {
    event(wall_time, step, |e| {
        let mut summary = Vec::new();
        for (tag, v) in values {
            let mut value = Vec::new();
            bytes_field(1, tag.as_bytes(), &mut value);
            value.push(0x15);
            value.extend_from_slice(&v.to_le_bytes());
            bytes_field(1, &value, &mut summary);
        }
        bytes_field(5, &summary, e);
    })
}

/// The step of an encoded event (0 when it has none).
pub fn event_step(data: &[u8]) -> u64 {
    let mut at = 0;
    while at < data.len() {
        let Some((key, n)) = read_varint(&data[at..]) else {
            return 0;
        };
        at += n;
        match (key >> 3, key & 7) {
            (2, 0) => return read_varint(&data[at..]).map_or(0, |(v, _)| v),
            (_, 0) => at += read_varint(&data[at..]).map_or(data.len(), |(_, n)| n),
            (_, 1) => at += 8,
            (_, 5) => at += 4,
            (_, 2) => match read_varint(&data[at..]) {
                Some((len, n)) => at += n + len as usize,
                None => return 0,
            },
            _ => return 0,
        }
    }
    0
}

fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The CRC-32C check value of "123456789" (RFC 3720).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_left_out() {
        let a = scalars(1.5, 7, &[("train/loss", 2.5)]);
        let mut file = record(&file_version(1.0));
        file.extend(record(&a));
        let whole = file.len();
        file.extend_from_slice(&record(&a)[..10]);
        let (recs, len) = read_records(&file);
        assert_eq!((recs.len(), len), (2, whole));
        assert_eq!(recs[1], &a[..]);
        assert_eq!(event_step(recs[1]), 7);
        assert_eq!(event_step(recs[0]), 0);
        // A flipped byte fails its CRC.
        let mut bad = record(&a);
        bad[14] ^= 1;
        assert_eq!(read_records(&bad).0.len(), 0);
    }
}
