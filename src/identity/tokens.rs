//! A small Rust lexer that reduces source text to its token stream, so comments (doc comments
//! included) and formatting never change an owned-code digest.
//!
//! The output is the tokens separated by `\n`. It is unambiguous because re-lexing the output gives
//! the same tokens: string, raw-string and char literals keep their delimiters and are emitted
//! whole; identifiers/numbers are maximal runs of `[A-Za-z0-9_]` and non-ASCII bytes; every other
//! byte is a one-byte punctuation token (so `a+=b` and `a += b` are equal, as in `proc_macro2`).

/// Appends the token stream of `src` to `out`.
///
/// Never fails: malformed input (an unterminated string or comment) is consumed to the end of
/// the file as one token, which still hashes deterministically.
pub(super) fn normalize_into(src: &[u8], out: &mut Vec<u8>) {
    let n = src.len();
    let mut i = 0;
    while i < n {
        let b = src[i];
        match b {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => i += 1,
            b'/' if i + 1 < n && src[i + 1] == b'/' => {
                i = match memchr(b'\n', &src[i..]) {
                    Some(p) => i + p,
                    None => n,
                };
            }
            b'/' if i + 1 < n && src[i + 1] == b'*' => i = skip_block_comment(src, i),
            b'"' => {
                let end = skip_quoted(src, i + 1, b'"');
                emit(out, &src[i..end]);
                i = end;
            }
            b'\'' => {
                let end = char_or_lifetime(src, i);
                emit(out, &src[i..end]);
                i = end;
            }
            _ if is_ident(b) => {
                if let Some(end) = raw_string(src, i) {
                    emit(out, &src[i..end]);
                    i = end;
                    continue;
                }
                let start = i;
                i += 1;
                while i < n && is_ident(src[i]) {
                    i += 1;
                }
                emit(out, &src[start..i]);
            }
            _ => {
                emit(out, &src[i..i + 1]);
                i += 1;
            }
        }
    }
}

#[inline]
fn emit(out: &mut Vec<u8>, tok: &[u8]) {
    out.extend_from_slice(tok);
    out.push(b'\n');
}

#[inline]
fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

#[inline]
fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

/// Skips a (nested) block comment starting at `i` (`/*`); returns the index after it.
fn skip_block_comment(src: &[u8], mut i: usize) -> usize {
    let n = src.len();
    let mut depth = 0usize;
    while i < n {
        if src[i] == b'/' && i + 1 < n && src[i + 1] == b'*' {
            depth += 1;
            i += 2;
        } else if src[i] == b'*' && i + 1 < n && src[i + 1] == b'/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    n
}

/// Index just after the closing `quote`, honouring backslash escapes.
fn skip_quoted(src: &[u8], mut i: usize, quote: u8) -> usize {
    let n = src.len();
    while i < n {
        match src[i] {
            b'\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    n
}

/// At a `'`: a char literal (`'a'`, `'\n'`, `'é'`) or a lifetime/label (`'a`, `'static`).
fn char_or_lifetime(src: &[u8], i: usize) -> usize {
    let n = src.len();
    if i + 1 >= n {
        return n;
    }
    if src[i + 1] == b'\\' {
        return skip_quoted(src, i + 1, b'\'');
    }
    // Length of the UTF-8 char after the quote.
    let w = match src[i + 1] {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    };
    if i + 1 + w < n && src[i + 1 + w] == b'\'' {
        return i + 2 + w;
    }
    // Lifetime: the quote plus an identifier.
    let mut j = i + 1;
    while j < n && is_ident(src[j]) {
        j += 1;
    }
    j.max(i + 1)
}

/// A raw string literal (`r"…"`, `r#"…"#`, `br#"…"#`, `cr"…"`) starting at `i`, if any.
fn raw_string(src: &[u8], i: usize) -> Option<usize> {
    let n = src.len();
    let mut j = i;
    if src[j] == b'b' || src[j] == b'c' {
        j += 1;
    }
    if j >= n || src[j] != b'r' {
        return None;
    }
    j += 1;
    let hashes_start = j;
    while j < n && src[j] == b'#' {
        j += 1;
    }
    let hashes = j - hashes_start;
    if j >= n || src[j] != b'"' {
        return None;
    }
    j += 1;
    while j < n {
        if src[j] == b'"' {
            let end = j + 1 + hashes;
            if end <= n && src[j + 1..end].iter().all(|&c| c == b'#') {
                return Some(end);
            }
        }
        j += 1;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        let mut out = Vec::new();
        normalize_into(s.as_bytes(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn comments_and_formatting_do_not_count() {
        let a = "fn f(x: u32) -> u32 { x + 1 }";
        let b = "/// Docs.\n//! inner doc\nfn f(\n    x: u32, // trailing\n) -> u32 {\n    /* block /* nested */ */ x+1\n}\n";
        assert_eq!(norm(a).replace(",\n", ""), norm(b).replace(",\n", ""));
        assert_eq!(norm("let x=1;"), norm("let   x =\n1 ;"));
        assert_eq!(norm("a+=b"), "a\n+\n=\nb\n");
    }

    #[test]
    fn code_changes_count() {
        assert_ne!(norm("x + 1"), norm("x + 2"));
        assert_ne!(norm("ab"), norm("a b"));
        assert_ne!(norm(r#"s = "a  b""#), norm(r#"s = "a b""#));
    }

    #[test]
    fn literals_hide_comment_markers() {
        assert_eq!(norm(r#""// not a comment""#), "\"// not a comment\"\n");
        assert_eq!(
            norm(r##"r#"has "quote" and /* x */"#"##),
            "r#\"has \"quote\" and /* x */\"#\n"
        );
        assert_eq!(norm(r#"br"raw""#), "br\"raw\"\n");
        assert_eq!(norm(r#""esc \" // x""#), "\"esc \\\" // x\"\n");
    }

    #[test]
    fn chars_and_lifetimes() {
        assert_eq!(norm("'a'"), "'a'\n");
        assert_eq!(norm("'\\''"), "'\\''\n");
        assert_eq!(norm("'é'"), "'é'\n");
        assert_eq!(norm("&'a str"), "&\n'a\nstr\n");
        assert_eq!(norm("'static"), "'static\n");
        assert_eq!(norm("'/' // c"), "'/'\n");
    }

    #[test]
    fn unterminated_input_is_consumed() {
        assert_eq!(norm("\"abc"), "\"abc\n");
        assert_eq!(norm("x /* never closed"), "x\n");
        assert_eq!(norm("r#\"abc"), "r#\"abc\n");
        assert_eq!(norm("'"), "'\n");
    }
}
