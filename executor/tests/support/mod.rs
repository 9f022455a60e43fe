//! Helpers for the executor's tests against the local Redis and RabbitMQ
//! (`scripts/services.sh` starts them). Unique names, the TCP proxy a test can cut and the broker
//! handle that cleans up are `redrive-test-support`'s, re-exported here; what
//! is the executor's own is a Redis connection made as the executor makes
//! it, and the deletion of a key prefix.

#![allow(dead_code, unused_imports)]

use std::time::Duration;

use redrive_executor::redis_topology::RedisConnection;
pub use redrive_test_support::{
    AMQP_ADDR, AMQP_URL, Broker, REDIS_ADDR, TcpProxy, amqp_url, redis_url, unique,
};

/// A connection to the local Redis (for setup and assertions), made by
/// [`redrive_executor::bucket::connect_redis`].
pub async fn redis() -> RedisConnection {
    redrive_executor::bucket::connect_redis(&redis_url(REDIS_ADDR), Duration::from_secs(5))
        .await
        .expect("the local redis answers")
}

/// Deletes every key starting with `prefix`.
pub async fn delete_prefix(connection: &mut RedisConnection, prefix: &str) {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(connection)
        .await
        .expect("KEYS");
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(connection)
            .await
            .expect("DEL");
    }
}
