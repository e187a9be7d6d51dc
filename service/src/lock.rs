//! One poison-tolerant way to take a `std::sync::Mutex`, for every program
//! that shares this crate.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, recovering the guard if a thread panicked while holding it.
///
/// The mutexes this is for guard plain data (maps, counters, queues) that
/// a panic cannot leave half-changed in a way worse than the panic itself,
/// so the program keeps going instead of panicking in turn.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_locks() {
        let m = Mutex::new(1);
        let _ = std::thread::scope(|s| {
            s.spawn(|| {
                let _guard = m.lock();
                panic!("poison it");
            })
            .join()
        });
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}
