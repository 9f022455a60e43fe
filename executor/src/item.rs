//! One item of a leased slice as the executor works with it, converted once
//! from the claim's answer (`v1::SliceItem`, coordinator.proto) where it
//! arrives: its position parsed, its dead letter present, its deadline a
//! time. Past the conversion nothing asks whether an item id is a number or
//! a dead letter is there.

use chrono::{DateTime, Utc};
use redrive_proto::v1;

/// One item of a leased slice ([`TryFrom<v1::SliceItem>`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeasedItem {
    /// Its position in the plan (the API's decimal `item_id`): positions grow
    /// in slice order, and the write-ahead mark names one.
    pub position: u64,
    /// The dead letter to replay: its message id, key, properties, headers
    /// and death. (Its `body` is empty: the bytes to publish are
    /// [`body`](Self::body).)
    pub dead_letter: v1::DeadLetter,
    /// The exchange to publish to (empty: the default exchange).
    pub exchange: String,
    /// The routing key to publish with.
    pub routing_key: String,
    /// Attempts already made by earlier leases.
    pub attempts: u32,
    /// An earlier lease left this item uncertain: it is published again,
    /// with the same message id.
    pub uncertain: bool,
    /// How many times this message key was redriven before.
    pub redrive_count: u32,
    /// The planner's record says this key was already replayed: reported
    /// `skipped_duplicate` without publishing.
    pub key_replayed: bool,
    /// The body to publish: the latest revision, else the captured body.
    pub body: Vec<u8>,
    /// A state-check hook covers this item: re-checked right before
    /// publishing.
    pub state_check: bool,
    /// Past this instant the item is stale: reported `skipped_stale`.
    pub stale_at: Option<DateTime<Utc>>,
    /// Plans whose replay of this key came back as a re-dead-letter.
    pub came_back_from: Vec<String>,
}

/// A slice item the executor cannot replay: a planner that does not speak
/// this executor's API. The slice is given back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("slice item {item_id:?}: {what}")]
pub struct InvalidItem {
    /// The item's `item_id` as received.
    pub item_id: String,
    /// What is wrong with it.
    pub what: &'static str,
}

impl TryFrom<v1::SliceItem> for LeasedItem {
    type Error = InvalidItem;

    /// # Errors
    /// [`InvalidItem`] when `item_id` is not a decimal position, the dead
    /// letter is missing, or `stale_at` is not a time (outside years
    /// 0001–9999).
    fn try_from(item: v1::SliceItem) -> Result<Self, Self::Error> {
        let invalid = |what| InvalidItem {
            item_id: item.item_id.clone(),
            what,
        };
        let position = item
            .item_id
            .parse()
            .map_err(|_| invalid("item_id is not a position"))?;
        let stale_at = match &item.stale_at {
            None => None,
            Some(at) => Some(
                redrive_proto::time::from_timestamp(at)
                    .ok_or_else(|| invalid("stale_at is not a time"))?,
            ),
        };
        let dead_letter = item
            .dead_letter
            .ok_or_else(|| invalid("the item has no dead letter"))?;
        Ok(Self {
            position,
            dead_letter,
            exchange: item.exchange,
            routing_key: item.routing_key,
            attempts: item.attempts,
            uncertain: item.uncertain,
            redrive_count: item.redrive_count,
            key_replayed: item.key_replayed,
            body: item.body,
            state_check: item.state_check,
            stale_at,
            came_back_from: item.came_back_from,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_checked_once_naming_what_is_wrong() {
        let good = v1::SliceItem {
            item_id: "17".to_owned(),
            dead_letter: Some(v1::DeadLetter::default()),
            stale_at: Some(redrive_proto::time::timestamp(
                DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            )),
            ..Default::default()
        };
        let item = LeasedItem::try_from(good.clone()).unwrap();
        let mut never = good.stale_at.unwrap();
        never.seconds = i64::MAX;
        assert_eq!(item.position, 17);
        assert_eq!(item.stale_at.map(|at| at.timestamp()), Some(1_700_000_000));
        for (bad, what) in [
            (
                v1::SliceItem {
                    item_id: "-1".to_owned(),
                    ..good.clone()
                },
                "item_id is not a position",
            ),
            (
                v1::SliceItem {
                    item_id: String::new(),
                    ..good.clone()
                },
                "item_id is not a position",
            ),
            (
                v1::SliceItem {
                    dead_letter: None,
                    ..good.clone()
                },
                "the item has no dead letter",
            ),
            (
                v1::SliceItem {
                    stale_at: Some(never),
                    ..good.clone()
                },
                "stale_at is not a time",
            ),
        ] {
            assert_eq!(LeasedItem::try_from(bad).unwrap_err().what, what);
        }
    }
}
