//! `pack_gpu_allocation` for 1k, 100k and 1M instances (target: linear, 1M < 50 ms).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use puzzletron::campaign::pack_gpu_allocation;

fn packing(c: &mut Criterion) {
    let mut g = c.benchmark_group("pack_gpu_allocation");
    for n in [1_000u32, 100_000, 1_000_000] {
        g.throughput(Throughput::Elements(u64::from(n)));
        // tp=3 on 8-GPU nodes: instances do not tile a node (2 per node, 2 GPUs idle).
        g.bench_with_input(BenchmarkId::new("tp3_on_8", n), &n, |b, &n| {
            b.iter(|| {
                pack_gpu_allocation("bench", black_box(n), black_box(3), black_box(8)).unwrap()
            })
        });
        // 16-GPU instances on 8-GPU nodes: multi-node, whole nodes.
        g.bench_with_input(BenchmarkId::new("multi_node_16_on_8", n), &n, |b, &n| {
            b.iter(|| {
                pack_gpu_allocation("bench", black_box(n), black_box(16), black_box(8)).unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, packing);
criterion_main!(benches);
