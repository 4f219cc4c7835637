//! Key paths: `a.b.0.c` / `a.b[0].c` addressing inside a [`Value`](super::Value) tree.

use std::fmt;

/// One step of a [`KeyPath`]: a mapping key or a list index.
///
/// Lookups are lenient the way OmegaConf is: a [`PathSegment::Key`] made of digits indexes a
/// list (`a.0`), and a [`PathSegment::Index`] on a mapping looks up the key `"0"`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum PathSegment {
    /// A mapping key.
    Key(String),
    /// A list index (0-based).
    Index(usize),
}

impl PathSegment {
    /// The segment as a list index, if it is one or is a key made only of ASCII digits.
    pub fn as_index(&self) -> Option<usize> {
        match self {
            PathSegment::Index(i) => Some(*i),
            PathSegment::Key(k) if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) => {
                k.parse().ok()
            }
            PathSegment::Key(_) => None,
        }
    }

    /// The segment as a mapping key (`Index(3)` becomes `"3"`).
    pub fn as_key(&self) -> std::borrow::Cow<'_, str> {
        match self {
            PathSegment::Key(k) => std::borrow::Cow::Borrowed(k),
            PathSegment::Index(i) => std::borrow::Cow::Owned(i.to_string()),
        }
    }
}

/// A path from the root of a config tree to one node, e.g. `mip.runs.params-90.solver`.
///
/// Displayed in dotted form with list indices in brackets (`tokenize_data.caches[0].output`);
/// the empty path (the root) displays as `<root>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct KeyPath(pub Vec<PathSegment>);

impl KeyPath {
    /// The root path (no segments).
    pub fn root() -> Self {
        KeyPath(Vec::new())
    }

    /// Parses a dotted path: segments separated by `.`, list indices either as `.0` or `[0]`.
    ///
    /// Returns `None` for an empty segment (`a..b`, a trailing dot) or an unclosed / non-numeric
    /// bracket. The empty string is the root path. Keys that themselves contain a dot (such as
    /// `ffn.intermediate_size`) cannot be addressed this way; build the path from segments.
    pub fn parse(text: &str) -> Option<Self> {
        let mut segs = Vec::new();
        if text.is_empty() {
            return Some(KeyPath(segs));
        }
        for part in text.split('.') {
            if part.is_empty() {
                return None;
            }
            let (head, mut rest) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if !head.is_empty() {
                segs.push(PathSegment::Key(head.to_string()));
            }
            while !rest.is_empty() {
                // `rest` starts with '[' here.
                let close = rest.find(']')?;
                let idx: usize = rest[1..close].parse().ok()?;
                segs.push(PathSegment::Index(idx));
                rest = &rest[close + 1..];
                if !rest.is_empty() && !rest.starts_with('[') {
                    return None;
                }
            }
        }
        Some(KeyPath(segs))
    }

    /// The segments, root first.
    pub fn segments(&self) -> &[PathSegment] {
        &self.0
    }

    /// Whether this is the root path.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// A new path with `key` appended.
    pub fn child_key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.0.push(PathSegment::Key(key.to_string()));
        p
    }

    /// A new path with list index `i` appended.
    pub fn child_index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(PathSegment::Index(i));
        p
    }

    /// The path without its last segment (`None` for the root).
    pub fn parent(&self) -> Option<Self> {
        if self.0.is_empty() {
            None
        } else {
            Some(KeyPath(self.0[..self.0.len() - 1].to_vec()))
        }
    }

    /// Whether `prefix` is a prefix of (or equal to) this path.
    pub fn starts_with(&self, prefix: &KeyPath) -> bool {
        self.0.starts_with(&prefix.0)
    }

    /// This path with `other`'s segments appended.
    pub fn join(&self, other: &KeyPath) -> Self {
        let mut p = self.clone();
        p.0.extend(other.0.iter().cloned());
        p
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("<root>");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                PathSegment::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                PathSegment::Index(idx) => write!(f, "[{idx}]")?,
            }
        }
        Ok(())
    }
}

impl From<&str> for PathSegment {
    fn from(s: &str) -> Self {
        PathSegment::Key(s.to_string())
    }
}

impl From<usize> for PathSegment {
    fn from(i: usize) -> Self {
        PathSegment::Index(i)
    }
}
