//! [`Hash`]: a SHA-256 digest, the unit of identity in puzzletron.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// A SHA-256 digest (32 bytes), shown and serialized as 64 lowercase hex characters.
///
/// Job keys, owned-code digests, lock-file digests and campaign contract hashes are all `Hash`es.
/// Two equal hashes mean "the same inputs", on any machine.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash([u8; 32]);

impl Hash {
    /// Length of the hex form, in characters.
    pub const HEX_LEN: usize = 64;

    /// The digest of `bytes`.
    pub fn of(bytes: impl AsRef<[u8]>) -> Self {
        Self(Sha256::digest(bytes.as_ref()).into())
    }

    /// Wraps raw digest bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The full 64-character lowercase hex form.
    pub fn to_hex(&self) -> String {
        let mut buf = [0u8; Self::HEX_LEN];
        self.write_hex(&mut buf).to_owned()
    }

    /// Writes the 64-character hex form into `buf` and returns it as text (no allocation: the
    /// store builds a path from it per cache hit).
    pub fn write_hex<'b>(&self, buf: &'b mut [u8; Self::HEX_LEN]) -> &'b str {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for (i, b) in self.0.iter().enumerate() {
            buf[2 * i] = DIGITS[usize::from(b >> 4)];
            buf[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
        }
        // Infallible: every byte written is an ASCII hex digit.
        std::str::from_utf8(buf).unwrap_or_default()
    }

    /// The first 12 hex characters, for display (not for lookups).
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

/// An incremental SHA-256 hasher with length-prefixed fields, so that `("ab","c")` and `("a","bc")`
/// never collide.
#[derive(Clone, Default)]
pub struct Hasher(Sha256);

impl Hasher {
    /// A hasher whose first input is the domain tag `domain` (e.g. `"puzzletron/job-key/v1"`).
    pub fn new(domain: &str) -> Self {
        let mut h = Self(Sha256::new());
        h.field(domain.as_bytes());
        h
    }

    /// Adds one length-prefixed field.
    pub fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    /// Adds raw bytes with no framing (for streaming one large field whose framing the caller owns).
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update(bytes);
        self
    }

    /// The digest.
    pub fn finish(self) -> Hash {
        Hash(self.0.finalize().into())
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.short())
    }
}

/// Error of [`Hash::from_str`]: the text is not 64 hex characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid hash {text:?}: expected 64 lowercase hex characters")]
#[non_exhaustive]
pub struct ParseHashError {
    /// The text that failed to parse (truncated to 80 characters).
    pub text: String,
}

impl FromStr for Hash {
    type Err = ParseHashError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseHashError {
            text: s.chars().take(80).collect(),
        };
        // Hand-rolled (lowercase only, one table lookup per digit, one check at the end): the
        // done index parses three hashes per line, 30k for a store of 10k runs.
        const BAD: u8 = 0xff;
        const NIBBLE: [u8; 256] = {
            let mut t = [BAD; 256];
            let mut i = 0;
            while i < 10 {
                t[b'0' as usize + i] = i as u8;
                i += 1;
            }
            let mut i = 0;
            while i < 6 {
                t[b'a' as usize + i] = 10 + i as u8;
                i += 1;
            }
            t
        };
        let bytes = s.as_bytes();
        if bytes.len() != Self::HEX_LEN {
            return Err(err());
        }
        let mut out = [0u8; 32];
        let mut bad = 0u8;
        for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            let (hi, lo) = (NIBBLE[pair[0] as usize], NIBBLE[pair[1] as usize]);
            // A bad digit's 0xff sets the high bit, which no good digit (0..=15) has.
            bad |= hi | lo;
            *o = (hi << 4) | (lo & 0x0f);
        }
        if bad & 0x80 != 0 {
            return Err(err());
        }
        Ok(Self(out))
    }
}

impl Serialize for Hash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; 64];
        // Infallible: the buffer is exactly twice the digest length.
        hex::encode_to_slice(self.0, &mut buf).map_err(serde::ser::Error::custom)?;
        s.serialize_str(std::str::from_utf8(&buf).map_err(serde::ser::Error::custom)?)
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor, not `Cow<str>` (which always allocates): records hold thousands of
        // digests, and a string borrowed from the input is parsed in place.
        struct HexVisitor;
        impl serde::de::Visitor<'_> for HexVisitor {
            type Value = Hash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a SHA-256 digest as 64 lowercase hex digits")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Hash, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(HexVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_known_vector() {
        let h = Hash::of(b"abc");
        assert_eq!(
            h.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(h.to_hex().parse::<Hash>().unwrap(), h);
        assert_eq!(h.short(), "ba7816bf8f01");
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(json, format!("\"{}\"", h.to_hex()));
        assert_eq!(serde_json::from_str::<Hash>(&json).unwrap(), h);
    }

    #[test]
    fn hex_of_every_byte_value_round_trips_and_matches_the_hex_crate() {
        for b in 0..=255u8 {
            let h = Hash::from_bytes([b; 32]);
            assert_eq!(h.to_hex(), hex::encode([b; 32]));
            assert_eq!(h.to_hex().parse::<Hash>().unwrap(), h);
        }
        // Every ASCII character that is not a lowercase hex digit, as the high and the low digit
        // of the first and the last byte.
        for c in (0u8..128)
            .map(char::from)
            .filter(|c| !matches!(c, '0'..='9' | 'a'..='f'))
        {
            for at in [0, 1, 62, 63] {
                let mut text: Vec<char> = "0".repeat(64).chars().collect();
                text[at] = c;
                let text: String = text.into_iter().collect();
                assert!(text.parse::<Hash>().is_err(), "{text:?} parsed");
            }
        }
        // 64 bytes that are not 64 characters.
        assert!(format!("é{}", "0".repeat(62)).parse::<Hash>().is_err());
    }

    #[test]
    fn bad_hex_is_refused() {
        for bad in ["", "abc", &"g".repeat(64), &"A".repeat(64)] {
            let e = bad.parse::<Hash>().unwrap_err();
            assert!(e.to_string().contains("expected 64 lowercase hex"), "{e}");
        }
    }

    #[test]
    fn fields_are_framed() {
        let mut a = Hasher::new("t");
        a.field(b"ab").field(b"c");
        let mut b = Hasher::new("t");
        b.field(b"a").field(b"bc");
        assert_ne!(a.finish(), b.finish());
    }
}
