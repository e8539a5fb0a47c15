//! Minimal percent-encoding helpers (query decoding, `encoding-type=url` listings).

/// Decodes an `application/x-www-form-urlencoded` query value (`+` is a space).
/// Invalid escapes are kept as they are; invalid UTF-8 is replaced.
pub fn decode_query(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Percent-encodes everything but unreserved characters and `/`, as S3 does for
/// `encoding-type=url` (decodable with both plain and form-style unquoting).
pub fn encode_url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for s in ["a b+c", "%", "é/ü#?&=", "", "x%2"] {
            assert_eq!(decode_query(&encode_url(s)), s);
        }
        assert_eq!(decode_query("a+b%2Bc%"), "a b+c%");
        assert_eq!(decode_query("%zz%4"), "%zz%4");
    }
}
