//! The process's record of read-write lock owners does not grow with threads that exited
//! (a file of its own: the record is process-wide, and other tests would change its size).

mod support;

use std::thread;
use std::time::Duration;

use redis_dlock::test_hooks::rw_owner_entries;
use redis_dlock::{DistributedLock, LockClient};
use support::{init_logging, RedisServer};

/// Threads that each take a hold and never release it (its lease dropped, as after
/// `into_lease` and a lost lease) leave nothing in the record once they exit.
#[test]
fn exited_threads_leave_no_owner_entries() {
    init_logging();
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).unwrap();
    const THREADS: usize = 40;
    let before = rw_owner_entries();
    for i in 0..THREADS {
        let client = client.clone();
        thread::spawn(move || {
            let rw = client
                .rw_lock(format!("rw-owners:{i}"))
                .ttl(Duration::from_secs(30))
                .build()
                .unwrap();
            let lease = if i % 2 == 0 {
                rw.read_lock().try_lock().unwrap().into_lease()
            } else {
                rw.write_lock().try_lock().unwrap().into_lease()
            };
            // Counted while the thread lives.
            assert!(rw_owner_entries() >= 1);
            drop(lease);
        })
        .join()
        .unwrap();
    }
    assert_eq!(
        rw_owner_entries(),
        before,
        "every exited thread's entries are gone"
    );
}
