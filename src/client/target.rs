//! [`ConnectionTarget`]: what a client connects to, as redis-rs's `IntoConnectionInfo` takes it.

use redis::RedisResult;

#[cfg(doc)]
use super::LockClient;

/// What [`LockClient::open`] and [`LockClient::builder`] connect to: everything redis-rs's
/// [`IntoConnectionInfo`](redis::IntoConnectionInfo) takes — a URL as `&str`, `String` or
/// [`url::Url`], a [`redis::ConnectionInfo`] (e.g. with a password set in code, or a unix
/// socket), a [`redis::ConnectionAddr`], a `(host, port)` pair — and a reference to a `String`
/// or a `ConnectionInfo`, which redis-rs does not take.
///
/// Not a blanket implementation over `IntoConnectionInfo`: with one, the two references could
/// not be added (redis-rs may implement the trait for them some day).
pub trait ConnectionTarget {
    /// The connection settings, or why the input is not one (a malformed URL).
    fn into_target_info(self) -> RedisResult<redis::ConnectionInfo>;
}

macro_rules! connection_target {
    ($($t:ty),*) => {$(
        impl ConnectionTarget for $t {
            fn into_target_info(self) -> RedisResult<redis::ConnectionInfo> {
                redis::IntoConnectionInfo::into_connection_info(self)
            }
        }
    )*};
}

connection_target!(
    &str,
    String,
    url::Url,
    redis::ConnectionInfo,
    redis::ConnectionAddr
);

impl<T: Into<String>> ConnectionTarget for (T, u16) {
    fn into_target_info(self) -> RedisResult<redis::ConnectionInfo> {
        redis::IntoConnectionInfo::into_connection_info(self)
    }
}

impl ConnectionTarget for &String {
    fn into_target_info(self) -> RedisResult<redis::ConnectionInfo> {
        redis::IntoConnectionInfo::into_connection_info(self.as_str())
    }
}

impl ConnectionTarget for &redis::ConnectionInfo {
    fn into_target_info(self) -> RedisResult<redis::ConnectionInfo> {
        Ok(self.clone())
    }
}
