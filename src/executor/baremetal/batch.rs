//! Coalescing of launches per host (issue 27, P06): submits that reach one host within a short
//! window, or while a launch exchange to it is in flight, go there in one exchange (one remote
//! script that launches all of them), so a fan-out of N submits costs a few SSH sessions, not N.
//!
//! The first caller for a host leads: it waits the window, takes everything queued for the host,
//! runs one exchange for it, hands each caller its own result, and repeats while more arrived in
//! the meantime. The others only wait for their result. A leader that is dropped (its caller
//! cancelled) hands the lead back and drops the queued callers' channels: they see `None`.

use super::lock;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;

/// Items waiting for one key (host), and whether a caller is leading them.
struct Queue<T, R> {
    pending: Vec<(T, oneshot::Sender<R>)>,
    leading: bool,
}

impl<T, R> Default for Queue<T, R> {
    fn default() -> Self {
        Queue {
            pending: Vec::new(),
            leading: false,
        }
    }
}

/// Batches items per key; see the module documentation.
pub(crate) struct Coalescer<T, R> {
    window: Duration,
    queues: Mutex<HashMap<String, Queue<T, R>>>,
    batches: AtomicU64,
}

/// Hands the lead of a key back when its leader ends, normally or dropped mid-way.
struct Lead<'a, T, R> {
    c: &'a Coalescer<T, R>,
    key: &'a str,
    /// Still leading (not handed back under the lock by the leader itself).
    armed: bool,
}

impl<T, R> Drop for Lead<'_, T, R> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut q = lock(&self.c.queues);
        if let Some(e) = q.get_mut(self.key) {
            e.leading = false;
            // Nobody leads them now: their callers see `None` rather than wait forever.
            e.pending.clear();
        }
    }
}

impl<T, R> Coalescer<T, R> {
    /// Items reaching a key within `window` of the first share one batch.
    pub(crate) fn new(window: Duration) -> Self {
        Coalescer {
            window,
            queues: Mutex::new(HashMap::new()),
            batches: AtomicU64::new(0),
        }
    }

    /// Batches run so far (each one call of the `run` function).
    pub(crate) fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Queues `item` for `key` and returns its result: `run` gets a batch and answers one
    /// result per item, in order (a missing one, or a dropped leader, gives `None`).
    pub(crate) async fn submit<F, Fut>(&self, key: &str, item: T, run: F) -> Option<R>
    where
        F: Fn(Vec<T>) -> Fut,
        Fut: Future<Output = Vec<R>>,
    {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut q = lock(&self.queues);
            let e = q.entry(key.to_string()).or_default();
            e.pending.push((item, tx));
            !std::mem::replace(&mut e.leading, true)
        };
        if lead {
            let mut lead = Lead {
                c: self,
                key,
                armed: true,
            };
            tokio::time::sleep(self.window).await;
            loop {
                let batch = {
                    let mut q = lock(&self.queues);
                    let e = q.entry(key.to_string()).or_default();
                    if e.pending.is_empty() {
                        // Handed back under the same lock as the empty take: what arrives
                        // next finds no leader and leads itself.
                        e.leading = false;
                        lead.armed = false;
                        break;
                    }
                    std::mem::take(&mut e.pending)
                };
                let (items, txs): (Vec<T>, Vec<oneshot::Sender<R>>) = batch.into_iter().unzip();
                self.batches.fetch_add(1, Ordering::Relaxed);
                let results = run(items).await;
                for (tx, r) in txs.into_iter().zip(results) {
                    // A caller that went away does not need its answer.
                    let _ = tx.send(r);
                }
            }
        }
        rx.await.ok()
    }
}

/// Runs `futs` concurrently on the calling task and returns their outputs in order.
pub(crate) async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    /// Sixteen callers at once for one host share a handful of batches; each gets its own
    /// result, and one item's failure is only its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_items_for_one_key_share_batches_and_keep_their_own_results() {
        let c = Arc::new(Coalescer::<u32, Result<u32, String>>::new(
            Duration::from_millis(10),
        ));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..16u32 {
            let c = Arc::clone(&c);
            let sizes = Arc::clone(&sizes);
            set.spawn(async move {
                let r = c
                    .submit("h7", i, |items: Vec<u32>| {
                        let sizes = Arc::clone(&sizes);
                        async move {
                            lock(&sizes).push(items.len());
                            // An exchange takes a while: later arrivals queue for the next.
                            tokio::time::sleep(Duration::from_millis(30)).await;
                            items
                                .into_iter()
                                .map(|x| {
                                    if x == 5 {
                                        Err(format!("no {x}"))
                                    } else {
                                        Ok(x * 10)
                                    }
                                })
                                .collect()
                        }
                    })
                    .await;
                (i, r)
            });
        }
        let mut got = Vec::new();
        while let Some(r) = set.join_next().await {
            got.push(r.unwrap());
        }
        got.sort_by_key(|(i, _)| *i);
        for (i, r) in &got {
            let want = if *i == 5 {
                Err("no 5".to_string())
            } else {
                Ok(i * 10)
            };
            assert_eq!(r.as_ref(), Some(&want), "item {i}");
        }
        let sizes = lock(&sizes).clone();
        assert_eq!(sizes.iter().sum::<usize>(), 16, "{sizes:?}");
        assert!(
            sizes.len() <= 3,
            "16 items in {} batches: {sizes:?}",
            sizes.len()
        );
        assert_eq!(c.batches(), sizes.len() as u64);
    }

    /// Keys are batched apart; an item after a batch ended leads a new one; a short answer
    /// leaves the unanswered caller with `None`.
    #[tokio::test]
    async fn keys_are_apart_and_a_missing_answer_is_none() {
        let c = Coalescer::<u32, u32>::new(Duration::from_millis(1));
        let calls = AtomicUsize::new(0);
        let run = |items: Vec<u32>| {
            calls.fetch_add(1, Ordering::Relaxed);
            async move { items.into_iter().filter(|&x| x != 3).collect::<Vec<_>>() }
        };
        let (a, b) = tokio::join!(c.submit("h1", 1, run), c.submit("h2", 2, run));
        assert_eq!((a, b), (Some(1), Some(2)));
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        assert_eq!(c.submit("h1", 3, run).await, None);
        assert_eq!(c.submit("h1", 4, run).await, Some(4));
        assert_eq!(c.batches(), 4);
    }

    /// A leader dropped while it waits does not leave the others waiting for ever.
    #[tokio::test]
    async fn a_dropped_leader_releases_the_queue() {
        let c = Coalescer::<u32, u32>::new(Duration::from_millis(50));
        let run = |items: Vec<u32>| async move { items };
        let lead = c.submit("h1", 1, run);
        let follow = c.submit("h1", 2, run);
        let (l, f) = tokio::join!(tokio::time::timeout(Duration::from_millis(5), lead), follow);
        assert!(l.is_err(), "the leader timed out");
        // The follower queued before the leader was dropped: it sees `None`, not a hang.
        assert_eq!(f, None);
        assert_eq!(c.submit("h1", 7, run).await, Some(7));
    }

    #[tokio::test]
    async fn join_all_keeps_order() {
        let futs: Vec<_> = [30u64, 1, 10]
            .into_iter()
            .map(|ms| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                ms
            })
            .collect();
        assert_eq!(join_all(futs).await, [30, 1, 10]);
    }
}
