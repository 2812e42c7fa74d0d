//! What a user of the published crate writes: owned guards, stats and the admin queries,
//! against a redis-server this test starts on a free loopback port. Nothing here comes from the
//! redis-dlock repository's own tests.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis_dlock::{ArcLockExt, DistributedLock, LockClient, LockError, LockState, Stats};
use redis_dlock::LockAdmin;

/// A throw-away redis-server, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Server {
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server on PATH");
            let mut server = Server { child, port };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if server.ping() {
                    return server;
                }
                if let Ok(Some(_)) = server.child.try_wait() {
                    break; // the port was taken meanwhile: try another
                }
                // A poll: another process gives no event to wait for.
                thread::sleep(Duration::from_millis(20));
            }
            let _ = server.child.kill();
        }
        panic!("could not start redis-server");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Through the `redis` crate that redis-dlock re-exports.
    fn ping(&self) -> bool {
        let Ok(client) = redis_dlock::redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis_dlock::redis::cmd("PING")
            .query::<String>(&mut con)
            .is_ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A service object that keeps its hold between calls, and may cross threads: a guard in its
/// `Send` form (a Token hold is its token's, not its thread's).
struct Job {
    hold: Option<redis_dlock::OwnedLockGuard<dyn DistributedLock, redis_dlock::GuardSend>>,
}

#[test]
fn owned_guards_stats_and_admin_queries() -> Result<(), LockError> {
    let server = Server::start();
    let client = LockClient::open(server.url())?;
    let admin = LockClient::open(server.url())?;
    assert_eq!(client.stats(), Stats::default());

    let lock: Arc<dyn DistributedLock> = Arc::from(
        client
            .lock("downstream:job")
            .ttl(Duration::from_secs(10))
            .build()?,
    );
    let watcher = admin.lock("downstream:job").build()?;
    assert_eq!(watcher.state()?, LockState::Unlocked);

    // An owned guard, kept in a struct, moved to another thread, released there.
    let mut job = Job {
        hold: Some(lock.lock_arc()?.into_send().expect("a Token hold")),
    };
    assert!(watcher.is_locked()?);
    let ttl = watcher.remaining_ttl()?.expect("a Token lock has a TTL");
    assert!(
        ttl > Duration::from_secs(9) && ttl <= Duration::from_secs(10),
        "{ttl:?}"
    );
    assert!(matches!(watcher.try_lock(), Err(LockError::Held { .. })));
    let guard = job.hold.take().expect("held");
    let released = thread::spawn(move || {
        let mut guard = guard;
        guard.extend(Duration::from_secs(20))?;
        guard.unlock()
    })
    .join()
    .expect("worker thread");
    assert!(released?);
    assert!(!watcher.is_locked()?);

    // An owned guard broken by an administrator: force_unlock deletes it, the holder learns.
    let guard = lock.try_lock_arc_for(Duration::from_secs(1))?;
    assert!(watcher.force_unlock()?);
    assert!(!watcher.force_unlock()?, "nothing left");
    assert!(matches!(guard.check(), Err(LockError::Lost { .. })));
    assert!(!guard.unlock()?);

    let stats = client.stats();
    assert_eq!(stats.acquires, 2);
    assert_eq!(stats.lost_holds, 1);
    assert_eq!(stats.timeouts, 0);
    assert_eq!(admin.stats().refusals, 1);
    Ok(())
}
