//! The bucket in Redis: one Lua script per step, on Redis's clock (see the
//! [`super`] docs, "Redis representation").

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redis::Script;

use crate::redis_topology::{RedisConnection, RedisTopology, connect};

use super::{
    BucketError, CHARGE_TOLERANCE_S, Grant, MIN_WAIT, NANOS_PER_SECOND, Rate, costs, split_ns,
};

/// The body of the GCRA step, after a prelude that sets `now_s`, `now_ns`
/// (the current time as whole seconds and nanoseconds). `KEYS[1]`: the bucket
/// key. `ARGV[1]`, `ARGV[2]`: the cost of the tokens asked for (`T * tokens`)
/// as seconds and nanoseconds; `ARGV[3]`, `ARGV[4]`: the tolerance `τ`
/// likewise. Returns `{1, 0, 0}` when granted, `{0, sec, nsec}` (the wait, at
/// least 1 ns) otherwise. Every time the script holds is a pair of integers
/// below 2^53, so the double arithmetic of Lua is exact.
macro_rules! gcra_script_body {
    () => {
        r"
local BILLION = 1000000000
local inc_s, inc_ns = tonumber(ARGV[1]), tonumber(ARGV[2])
local tol_s, tol_ns = tonumber(ARGV[3]), tonumber(ARGV[4])
local function add(a_s, a_ns, b_s, b_ns)
  local s, ns = a_s + b_s, a_ns + b_ns
  if ns >= BILLION then
    return s + 1, ns - BILLION
  end
  return s, ns
end
local function sub(a_s, a_ns, b_s, b_ns)
  local s, ns = a_s - b_s, a_ns - b_ns
  if ns < 0 then
    return s - 1, ns + BILLION
  end
  return s, ns
end
local function less(a_s, a_ns, b_s, b_ns)
  return a_s < b_s or (a_s == b_s and a_ns < b_ns)
end
local tat_s, tat_ns = now_s, now_ns
local stored = redis.call('GET', KEYS[1])
if stored then
  local s, ns = string.match(stored, '^(%d+) (%d+)$')
  if s then
    s, ns = tonumber(s), tonumber(ns)
    if ns < BILLION and less(now_s, now_ns, s, ns) then
      tat_s, tat_ns = s, ns
    end
  end
end
local new_s, new_ns = add(tat_s, tat_ns, inc_s, inc_ns)
local limit_s, limit_ns = add(now_s, now_ns, tol_s, tol_ns)
if less(limit_s, limit_ns, new_s, new_ns) then
  local wait_s, wait_ns = sub(new_s, new_ns, limit_s, limit_ns)
  return {0, wait_s, wait_ns}
end
local ttl_s, ttl_ns = sub(new_s, new_ns, now_s, now_ns)
local ttl_ms = ttl_s * 1000 + math.ceil(ttl_ns / 1000000)
if ttl_ms < 1 then
  ttl_ms = 1
end
redis.call('SET', KEYS[1], string.format('%.0f %.0f', new_s, new_ns), 'PX', string.format('%.0f', ttl_ms))
return {1, 0, 0}
"
    };
}

/// The GCRA step on Redis's clock (`TIME`: seconds and µs); arguments and
/// answer as described on the script body above.
const GCRA_SCRIPT: &str = concat!(
    "local time = redis.call('TIME')\n",
    "local now_s, now_ns = tonumber(time[1]), tonumber(time[2]) * 1000\n",
    gcra_script_body!()
);

/// The same step at an explicit time (`ARGV[5]` seconds, `ARGV[6]`
/// nanoseconds), to compare the script with [`gcra_step`] exactly.
#[cfg(test)]
pub(super) const GCRA_SCRIPT_AT: &str = concat!(
    "local now_s, now_ns = tonumber(ARGV[5]), tonumber(ARGV[6])\n",
    gcra_script_body!()
);

/// Opens a reconnecting connection to one Redis server for the bucket and
/// the replay keys ([`crate::replay_keys::ReplayKeys`]): [`connect`] with
/// [`RedisTopology::Standalone`]. Connection attempts and responses time out
/// after `call_timeout`; after a failure the connection reconnects in the
/// background, and calls fail until it has.
///
/// # Errors
/// The URL is invalid or Redis does not answer within `call_timeout`.
pub async fn connect_redis(
    redis_url: &str,
    call_timeout: Duration,
) -> redis::RedisResult<RedisConnection> {
    connect(
        &RedisTopology::Standalone(redis_url.to_owned()),
        call_timeout,
    )
    .await
}

/// The GCRA bucket in Redis, shared by every executor that uses the same
/// Redis and key prefix.
#[derive(Clone)]
pub struct RedisBucket {
    connection: RedisConnection,
    key_prefix: String,
    call_timeout: Duration,
    script: Arc<Script>,
    calls: Arc<AtomicU64>,
}

impl RedisBucket {
    /// A bucket over `connection`; destination `d` is stored under
    /// `{key_prefix}{d}` (normally [`DEFAULT_KEY_PREFIX`]). Each Redis call
    /// that takes longer than `call_timeout` (normally
    /// [`DEFAULT_CALL_TIMEOUT`]) fails as [`BucketError::Unavailable`].
    pub fn new(
        connection: RedisConnection,
        key_prefix: impl Into<String>,
        call_timeout: Duration,
    ) -> Self {
        Self {
            connection,
            key_prefix: key_prefix.into(),
            call_timeout,
            script: Arc::new(Script::new(GCRA_SCRIPT)),
            calls: Arc::new(AtomicU64::new(0)),
        }
    }

    /// [`connect_redis`] then [`RedisBucket::new`].
    ///
    /// # Errors
    /// [`BucketError::Unavailable`] when Redis cannot be reached.
    pub async fn connect(
        redis_url: &str,
        key_prefix: impl Into<String>,
        call_timeout: Duration,
    ) -> Result<Self, BucketError> {
        let connection = connect_redis(redis_url, call_timeout)
            .await
            .map_err(|error| BucketError::Unavailable {
                reason: format!("cannot connect to redis: {error}"),
            })?;
        Ok(Self::new(connection, key_prefix, call_timeout))
    }

    /// The Redis key holding destination `key`'s TAT (`"SEC NSEC"`).
    pub fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.key_prefix)
    }

    /// Script calls ([`RedisBucket::try_acquire`]) made so far by this bucket
    /// and its clones, granted or not: what a waiting caller costs Redis.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// One GCRA step on Redis's clock: takes `tokens` now or says how long to
    /// wait (exact to the ns, at least 1 ns; no floor applied here). One
    /// `EVALSHA` (the script is loaded on `NOSCRIPT`).
    ///
    /// # Errors
    /// As [`Bucket::acquire`].
    pub async fn try_acquire(
        &self,
        key: &str,
        rate: Rate,
        tokens: u32,
    ) -> Result<Grant, BucketError> {
        let (increment, tolerance) = costs(rate, tokens)?;
        let (increment_s, increment_ns) = split_ns(increment);
        let (tolerance_s, tolerance_ns) = split_ns(tolerance);
        let call = self.step(key, [increment_s, increment_ns, tolerance_s, tolerance_ns]);
        let answer = match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                return Err(BucketError::Unavailable {
                    reason: format!("redis call failed: {error}"),
                });
            }
            Err(_) => {
                return Err(BucketError::Unavailable {
                    reason: format!("redis did not answer within {:?}", self.call_timeout),
                });
            }
        };
        grant_from_answer(answer)
    }

    /// [`Bucket::charge`] on Redis: the GCRA step with a tolerance so large
    /// (10^12 s) that it always grants, so the TAT moves by `T * tokens`.
    ///
    /// # Errors
    /// As [`Bucket::charge`].
    pub async fn charge(&self, key: &str, rate: Rate, tokens: u32) -> Result<(), BucketError> {
        rate.validate()?;
        if tokens == 0 {
            return Ok(());
        }
        let increment = rate
            .emission_interval_ns()
            .saturating_mul(u64::from(tokens));
        let (increment_s, increment_ns) = split_ns(increment);
        let call = self.step(key, [increment_s, increment_ns, CHARGE_TOLERANCE_S, 0]);
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok((1, _, _))) => Ok(()),
            Ok(Ok(answer)) => Err(BucketError::Unavailable {
                reason: format!("the bucket script refused a charge: {answer:?}"),
            }),
            Ok(Err(error)) => Err(BucketError::Unavailable {
                reason: format!("redis call failed: {error}"),
            }),
            Err(_) => Err(BucketError::Unavailable {
                reason: format!("redis did not answer within {:?}", self.call_timeout),
            }),
        }
    }

    /// One run of the GCRA script on destination `key`'s bucket with
    /// `arguments` (`ARGV[1..4]`, see the script). On one server and under
    /// Sentinel: `EVALSHA`, loading the script on `NOSCRIPT`. On a Redis
    /// Cluster: `EVAL` with the script's text (Redis caches it too), because
    /// the load after a `NOSCRIPT` goes to every node, replicas included,
    /// and fails while any of them is unreachable.
    async fn step(&self, key: &str, arguments: [u64; 4]) -> redis::RedisResult<(i64, i64, i64)> {
        let mut connection = self.connection.clone();
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.connection.is_cluster() {
            let mut command = redis::cmd("EVAL");
            command
                .arg(GCRA_SCRIPT)
                .arg(1)
                .arg(self.redis_key(key))
                .arg(&arguments[..]);
            return command.query_async(&mut connection).await;
        }
        let mut invocation = self.script.key(self.redis_key(key));
        for argument in arguments {
            invocation.arg(argument);
        }
        invocation.invoke_async(&mut connection).await
    }

    /// [`Bucket::acquire`] on Redis: calls [`RedisBucket::try_acquire`] until
    /// granted, sleeping after each refusal the longer of its answer and
    /// [`MIN_WAIT`].
    ///
    /// # Errors
    /// As [`Bucket::acquire`].
    pub async fn acquire(&self, key: &str, rate: Rate, tokens: u32) -> Result<(), BucketError> {
        loop {
            match self.try_acquire(key, rate, tokens).await? {
                Grant::Granted => return Ok(()),
                Grant::RetryAfter(wait) => tokio::time::sleep(wait.max(MIN_WAIT)).await,
            }
        }
    }
}

/// The script's `{granted, sec, nsec}` as a [`Grant`].
fn grant_from_answer((granted, seconds, nanos): (i64, i64, i64)) -> Result<Grant, BucketError> {
    if granted == 1 {
        return Ok(Grant::Granted);
    }
    match (u64::try_from(seconds), u32::try_from(nanos)) {
        (Ok(seconds), Ok(nanos)) if granted == 0 && u64::from(nanos) < NANOS_PER_SECOND => {
            let wait = Duration::new(seconds, nanos);
            Ok(Grant::RetryAfter(wait.max(Duration::from_nanos(1))))
        }
        _ => Err(BucketError::Unavailable {
            reason: format!(
                "the bucket script answered {{{granted}, {seconds}, {nanos}}}, not a grant or a wait"
            ),
        }),
    }
}
