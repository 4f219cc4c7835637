//! Properties of `pack_gpu_allocation`: no GPU given twice, no instance split across nodes,
//! multi-node instances exclusive, node count minimal.

use std::collections::HashSet;

use proptest::prelude::*;
use puzzletron::campaign::{PlanError, pack_gpu_allocation};

/// Instance sizes that are valid for `gpn`: anything up to a node, or a multiple of a node.
fn case() -> impl Strategy<Value = (u32, u32, u32)> {
    (1u32..=16, 1u32..=300).prop_flat_map(|(gpn, instances)| {
        let fits = 1..=gpn;
        let multi = (2u32..=4).prop_map(move |k| k * gpn);
        (Just(gpn), prop_oneof![fits, multi], Just(instances))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn packing_properties((gpn, gpi, instances) in case()) {
        let a = pack_gpu_allocation("prop", instances, gpi, gpn).unwrap();
        prop_assert_eq!(a.placements().len(), instances as usize);
        prop_assert_eq!(a.total_gpus, u64::from(instances) * u64::from(gpi));

        // No GPU given twice, every GPU id within its node, every node index within the allocation.
        let mut used: HashSet<(u32, u32)> = HashSet::new();
        for p in a.placements() {
            for node in p.nodes() {
                prop_assert!(node < a.nodes);
                for gpu in p.local_gpu_ids() {
                    prop_assert!(gpu < gpn, "gpu {} on a {}-GPU node", gpu, gpn);
                    prop_assert!(used.insert((node, gpu)), "GPU {} of node {} given twice", gpu, node);
                }
            }
            // Never split: an instance that fits in a node is on exactly one node with all its GPUs.
            if gpi <= gpn {
                prop_assert_eq!(p.node_count, 1);
                prop_assert_eq!(p.gpus_on_node, gpi);
            } else {
                // Multi-node instances take whole nodes...
                prop_assert_eq!(p.gpus_on_node, gpn);
                prop_assert_eq!(p.node_count * gpn, gpi);
            }
        }
        prop_assert_eq!(used.len() as u64, a.total_gpus);
        if gpi > gpn {
            // ... exclusively: no node hosts two instances.
            let mut owner: HashSet<u32> = HashSet::new();
            for p in a.placements() {
                for node in p.nodes() {
                    prop_assert!(owner.insert(node), "node {} shared by a multi-node instance", node);
                }
            }
            prop_assert!(a.exclusive);
            prop_assert_eq!(u64::from(a.nodes), u64::from(instances) * u64::from(gpi / gpn));
        } else {
            // Minimal: a node holds at most floor(gpn / gpi) unsplit instances, so no packing
            // can use fewer than ceil(instances / that) nodes; ours uses exactly that many.
            let per_node = gpn / gpi;
            prop_assert_eq!(a.nodes, instances.div_ceil(per_node));
            prop_assert!(u64::from(a.nodes) * u64::from(gpn) >= a.total_gpus);
            prop_assert_eq!(a.exclusive, a.total_gpus == u64::from(a.nodes) * u64::from(gpn));
        }
        // Per-node GPU counts add up.
        let sum: u64 = (0..a.nodes).map(|n| u64::from(a.gpus_on_node(n))).sum();
        prop_assert_eq!(sum, a.total_gpus);
    }

    #[test]
    fn oversized_instances_that_are_not_node_multiples_are_refused(gpn in 2u32..=16, k in 1u32..=4, r in 1u32..16, n in 1u32..10) {
        let r = r % gpn;
        prop_assume!(r != 0);
        let gpi = k * gpn + r;
        let err = pack_gpu_allocation("prop", n, gpi, gpn).unwrap_err();
        prop_assert!(matches!(err, PlanError::Packing { .. }), "{}", err);
    }
}

#[test]
fn five_tp3_instances_on_8_gpu_nodes_need_three_nodes() {
    let a = pack_gpu_allocation("aiperf", 5, 3, 8).unwrap();
    assert_eq!(
        a.nodes, 3,
        "ceil(15/8) = 2 would split an instance across nodes"
    );
    let layout: Vec<(u32, Vec<u32>)> = a
        .placements()
        .iter()
        .map(|p| (p.node, p.local_gpu_ids().collect()))
        .collect();
    assert_eq!(
        layout,
        vec![
            (0, vec![0, 1, 2]),
            (0, vec![3, 4, 5]),
            (1, vec![0, 1, 2]),
            (1, vec![3, 4, 5]),
            (2, vec![0, 1, 2])
        ]
    );
}

#[test]
fn zero_sizes_are_refused_with_context() {
    for (n, gpi, gpn) in [(0, 1, 8), (1, 0, 8), (1, 1, 0)] {
        let e = pack_gpu_allocation("stage `x`", n, gpi, gpn).unwrap_err();
        assert!(e.to_string().starts_with("stage `x`: cannot pack"), "{e}");
    }
}
