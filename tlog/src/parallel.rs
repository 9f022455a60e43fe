//! Splitting large, independent work over the machine's cores (scoped
//! standard threads; nothing is shared but read-only input).

use std::num::NonZeroUsize;

/// The most threads used.
const MAX_WORKERS: usize = 8;

/// How many threads to use for `items` pieces of work, given that fewer
/// than `min_per_worker` are not worth a thread.
pub(crate) fn workers(items: usize, min_per_worker: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    cores
        .min(MAX_WORKERS)
        .min(items / min_per_worker.max(1))
        .max(1)
}

/// `items.iter().map(f).collect()`, on up to [`workers`] threads for large
/// slices; the results keep the items' order.
pub(crate) fn map<T, R, F>(items: &[T], f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
{
    let workers = workers(items.len(), 20_000);
    if workers <= 1 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(workers);
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<R>>()))
            .collect();
        let mut results = Vec::with_capacity(items.len());
        for handle in handles {
            match handle.join() {
                Ok(part) => results.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        results
    })
}
