//! Raw Redis commands on a plain connection, to set up and check what the locks store.
//!
//! Every helper panics (naming the command) if Redis answers with an error.

use std::time::Duration;

/// `GET key`.
pub fn get(conn: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query(conn).expect("GET")
}

/// `GET key` as a number; 0 for a missing key.
pub fn get_i64(conn: &mut redis::Connection, key: &str) -> i64 {
    let v: Option<i64> = redis::cmd("GET").arg(key).query(conn).expect("GET");
    v.unwrap_or(0)
}

/// `SET key value` (no expiry).
pub fn set(conn: &mut redis::Connection, key: &str, value: &[u8]) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(conn)
        .expect("SET");
}

/// `DEL key`.
pub fn del(conn: &mut redis::Connection, key: &str) {
    let _: i64 = redis::cmd("DEL").arg(key).query(conn).expect("DEL");
}

/// `EXISTS key`.
pub fn exists(conn: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(conn)
        .expect("EXISTS")
        == 1
}

/// `PTTL key`: -1 for a key without expiry, -2 for a missing key.
pub fn pttl(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).expect("PTTL")
}

/// Makes `key` a hash (`HSET key field value`), a key of the wrong type for a lock.
pub fn make_hash(conn: &mut redis::Connection, key: &str) {
    let _: i64 = redis::cmd("HSET")
        .arg(key)
        .arg("field")
        .arg("value")
        .query(conn)
        .expect("HSET");
}

/// `HGET key field`: what [`make_hash`] stored, if it is still there.
pub fn hash_field(conn: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg("field")
        .query(conn)
        .expect("HGET")
}

/// How many calls of `command` Redis has served (INFO commandstats).
pub fn command_calls(conn: &mut redis::Connection, command: &str) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse().expect("a call count"))
        .unwrap_or(0)
}

/// `SCRIPT FLUSH`: empties the server's script cache.
pub fn script_flush(conn: &mut redis::Connection) {
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(conn)
        .expect("SCRIPT FLUSH");
}

/// How many scripts the server has cached (`number_of_cached_scripts` of INFO memory).
pub fn cached_scripts(conn: &mut redis::Connection) -> usize {
    super::info_field(conn, "memory", "number_of_cached_scripts")
        .and_then(|n| n.parse().ok())
        .expect("number_of_cached_scripts in INFO memory")
}

/// The unprotected read-modify-write of the counter at `key` that only mutual exclusion keeps
/// correct: GET, a pause that widens the race window, SET to the value read plus one.
pub fn bump_counter(conn: &mut redis::Connection, key: &str) {
    let value: Option<i64> = redis::cmd("GET").arg(key).query(conn).expect("GET");
    super::work(Duration::from_micros(50));
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value.unwrap_or(0) + 1)
        .query(conn)
        .expect("SET");
}

/// `PUBSUB NUMSUB channel`: how many connections subscribe to it.
pub fn numsub(conn: &mut redis::Connection, channel: &str) -> i64 {
    let reply: (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(conn)
        .expect("PUBSUB NUMSUB");
    reply.1
}
