//! PLACEHOLDER: the reentrant lock (Redisson RLock layout) is being implemented.

use crate::client::LockClient;
use crate::hold::HoldOptions;

/// A lock of [`Strategy::Reentrant`](crate::Strategy::Reentrant).
#[derive(Debug)]
pub struct ReentrantLock {
    client: LockClient,
    key: String,
    opts: HoldOptions,
}

impl ReentrantLock {
    pub(crate) fn new(client: LockClient, key: String, opts: HoldOptions) -> Self {
        ReentrantLock { client, key, opts }
    }
}
