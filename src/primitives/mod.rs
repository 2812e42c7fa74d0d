//! Every primitive, one module each: the locks held at one key (Token, Classic, Spring,
//! ShedLock, Reentrant, Fair), the read-write lock, RedLock, the multi-lock, and what they
//! share (`hold`, `string_value`). Each gives the runtime its leases as data
//! (docs/architecture.md).
//!
//! A primitive's module and its public names are declared here, and only here: lib.rs passes
//! them on as they are.

pub(crate) mod classic;
pub use classic::{ClassicLock, ClassicOptions, Encoding, Takeover};
pub(crate) mod fair;
pub use fair::FairLock;
pub(crate) mod hold;
pub use hold::WakeUp;
pub(crate) mod multilock;
pub use multilock::{MultiGuard, MultiLock, MultiLockBuilder};
pub(crate) mod redlock;
pub use redlock::{RedLock, RedLockBuilder, RedLockClient, RedLockClientBuilder};
pub(crate) mod reentrant;
pub use reentrant::ReentrantLock;
pub(crate) mod rwlock;
pub use rwlock::{ReadLock, ReadWriteLock, ReadWriteLockBuilder, WriteLock};
pub(crate) mod semaphore;
pub use semaphore::{Permit, Semaphore, SemaphoreBuilder};
pub(crate) mod shedlock;
pub use shedlock::shedlock_key;
pub(crate) mod spring;
pub use spring::{SpringLock, SpringOptions};
pub(crate) mod string_value;
pub(crate) mod token;
pub use token::TokenLock;
