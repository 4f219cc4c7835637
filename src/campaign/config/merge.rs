//! Deep merge, OmegaConf-style: mappings merge key by key; lists, scalars and type changes
//! replace.

use super::origin::Origins;
use super::path::KeyPath;
use super::value::{Mapping, Value};

/// Merges `src` (whose origins are `src_origins`, relative to `src` itself) into the node of
/// `dst` at `at`, creating mappings along `at` as needed.
///
/// Rules (as `OmegaConf.merge`): mapping onto mapping merges recursively, keeping the
/// destination's key order and appending new keys; anything else replaces the destination
/// node (a list replaces a list, `null` replaces a mapping, a mapping replaces a scalar).
pub(crate) fn merge_at(
    dst: &mut Value,
    dst_origins: &mut Origins,
    at: &KeyPath,
    src: Value,
    src_origins: &Origins,
) {
    let mut node = dst;
    for seg in at.segments() {
        if !matches!(node, Value::Mapping(_)) {
            *node = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(m) = node else {
            unreachable!("just made a mapping")
        };
        node = m.entry(seg.as_key().into_owned()).or_insert(Value::Null);
    }
    merge_node(node, dst_origins, at, src, src_origins, &KeyPath::root());
}

fn merge_node(
    dst: &mut Value,
    dst_origins: &mut Origins,
    dst_path: &KeyPath,
    src: Value,
    src_origins: &Origins,
    src_path: &KeyPath,
) {
    match (dst, src) {
        (Value::Mapping(d), Value::Mapping(s)) => {
            if dst_origins.get(dst_path).is_none()
                && let Some(o) = src_origins.get(src_path)
            {
                dst_origins.insert(dst_path.clone(), o.clone());
            }
            for (k, v) in s {
                let dp = dst_path.child_key(&k);
                let sp = src_path.child_key(&k);
                match d.get_mut(&k) {
                    Some(existing) => merge_node(existing, dst_origins, &dp, v, src_origins, &sp),
                    None => {
                        dst_origins.remove_subtree(&dp);
                        dst_origins.insert_subtree(&dp, src_origins.subtree(&sp));
                        d.insert(k, v);
                    }
                }
            }
        }
        (d, s) => {
            *d = s;
            dst_origins.remove_subtree(dst_path);
            dst_origins.insert_subtree(dst_path, src_origins.subtree(src_path));
        }
    }
}
