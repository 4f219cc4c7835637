//! Slurm hostlists (`n[1-3,7],gpu05`): what `squeue`/`sacct` print for a job's nodes and what
//! `--exclude` takes (slurm.conf(5), "NodeName"; scontrol(1), `show hostnames`). Crate-private:
//! the executors read them, the campaign controller names nodes with them.

/// Node lists that name no node (`squeue`/`sacct` placeholders, the local executor's host).
const NO_NODE: &[&str] = &["", "none", "(null)", "none assigned", "localhost"];

/// Expands a Slurm hostlist (`n[1-3,7],gpu05`, zero padding kept: `node[08-10]`) into node
/// names, in order, without duplicates. A part that is not a valid range is kept as written
/// (a name with brackets is rare, and never dropped), and placeholders (`None`, `(null)`,
/// `localhost`) give nothing.
pub(crate) fn expand_hostlist(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |n: String| {
        if !NO_NODE.contains(&n.to_ascii_lowercase().as_str()) && !out.contains(&n) {
            out.push(n);
        }
    };
    // Split at commas outside brackets.
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    for part in parts.into_iter().map(str::trim) {
        match expand_one(part) {
            Some(names) => names.into_iter().for_each(&mut push),
            None => push(part.to_string()),
        }
    }
    out
}

/// `prefix[a-b,c]suffix` → names; `None` when `part` has no well-formed bracket.
fn expand_one(part: &str) -> Option<Vec<String>> {
    let Some(open) = part.find('[') else {
        return Some(vec![part.to_string()]);
    };
    let close = open + part[open..].find(']')?;
    let (prefix, ranges, suffix) = (&part[..open], &part[open + 1..close], &part[close + 1..]);
    let mut names = Vec::new();
    for r in ranges.split(',') {
        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
        let (a, b): (u64, u64) = (lo.parse().ok()?, hi.parse().ok()?);
        // A list of more than 100k nodes is a parse accident, not a cluster.
        if b < a || b - a > 100_000 {
            return None;
        }
        let width = lo.len();
        for n in a..=b {
            // The suffix may hold another bracket (`a[1-2]b[3-4]`): expand it recursively.
            for tail in expand_one(suffix)? {
                names.push(format!("{prefix}{n:0width$}{tail}"));
            }
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists_expand_with_padding_and_placeholders_give_nothing() {
        let cases: &[(&str, &[&str])] = &[
            ("n2", &["n2"]),
            ("n[1-3]", &["n1", "n2", "n3"]),
            ("n[1-2,4],gpu05", &["n1", "n2", "n4", "gpu05"]),
            ("node[08-10]", &["node08", "node09", "node10"]),
            ("a[1-2]b[3-4]", &["a1b3", "a1b4", "a2b3", "a2b4"]),
            ("n1,n1", &["n1"]),
            ("None", &[]),
            ("(null)", &[]),
            ("localhost", &[]),
            ("", &[]),
            // Malformed: kept as written, never dropped or guessed.
            ("n[x-2]", &["n[x-2]"]),
            ("n[3-1]", &["n[3-1]"]),
        ];
        for (input, want) in cases {
            assert_eq!(expand_hostlist(input), *want, "{input}");
        }
    }
}
