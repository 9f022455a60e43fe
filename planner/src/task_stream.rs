//! Streams fed by a task through a bounded channel, which end with an error
//! when the task dies before it finishes.
//!
//! A channel that closes looks the same whether its sender finished or died
//! (a panic, a cancelled task): a reader would take a cut stream for the
//! whole one. A precheck would report on fewer dead letters than were
//! selected, an audit export would end with `OK` and rows missing, without
//! a word. Here the task says it finished; a stream whose task did not ends
//! with one error item.

use futures::{StreamExt, stream::BoxStream};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

/// The items of `receiver`, then, when its sender was dropped without
/// `finished` being sent first, `interrupted()` as a last item.
pub(crate) fn until_finished<T, E>(
    receiver: mpsc::Receiver<Result<T, E>>,
    finished: oneshot::Receiver<()>,
    interrupted: impl FnOnce() -> E + Send + 'static,
) -> BoxStream<'static, Result<T, E>>
where
    T: Send + 'static,
    E: Send + 'static,
{
    let end =
        futures::stream::once(async move { finished.await.err().map(|_| Err(interrupted())) })
            .filter_map(std::future::ready);
    ReceiverStream::new(receiver).chain(end).boxed()
}

/// Spawns `produce` with the sender of a channel of `capacity` items and
/// returns the channel's stream ([`until_finished`]: `interrupted()` ends it
/// when `produce` panics). The stream ends when `produce` returns.
pub(crate) fn spawn_stream<T, E, Produce, Work>(
    capacity: usize,
    produce: Produce,
    interrupted: impl FnOnce() -> E + Send + 'static,
) -> BoxStream<'static, Result<T, E>>
where
    T: Send + 'static,
    E: Send + 'static,
    Produce: FnOnce(mpsc::Sender<Result<T, E>>) -> Work,
    Work: Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = mpsc::channel(capacity);
    let (finished, finished_signal) = oneshot::channel();
    let work = produce(sender);
    tokio::spawn(async move {
        work.await;
        let _ = finished.send(());
    });
    until_finished(receiver, finished_signal, interrupted)
}

/// `result`'s value, or `None` once its error has been sent to the
/// stream's reader (as the gRPC status of [`crate::error::Error`]): the
/// producing task then returns, and the stream ends with that error.
pub(crate) async fn or_send_error<T, U>(
    result: Result<T, crate::store::StoreError>,
    sender: &mpsc::Sender<Result<U, tonic::Status>>,
) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) => {
            let status = tonic::Status::from(crate::error::Error::from(error));
            let _ = sender.send(Err(status)).await;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a reader collects from a task that sends `1` and `2`, then
    /// panics when `panics`.
    async fn collected(panics: bool) -> Vec<Result<u32, String>> {
        spawn_stream(
            1,
            move |sender| async move {
                for item in [1, 2] {
                    let _ = sender.send(Ok(item)).await;
                }
                assert!(!panics, "a defect while reading");
            },
            || "interrupted".to_owned(),
        )
        .collect()
        .await
    }

    #[tokio::test]
    async fn a_store_error_goes_to_the_reader_as_its_status_and_the_value_through() {
        let (sender, mut receiver) = mpsc::channel::<Result<u32, tonic::Status>>(1);
        let passed = or_send_error(Ok(7), &sender).await;
        assert_eq!(passed, Some(7));
        let failed: Option<u32> = or_send_error(
            Err(crate::store::StoreError::Unavailable(
                sqlx::Error::PoolTimedOut,
            )),
            &sender,
        )
        .await;
        assert_eq!(failed, None);
        let status = receiver
            .recv()
            .await
            .expect("one item")
            .expect_err("an error");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(receiver.try_recv().is_err(), "nothing else was sent");
    }

    #[tokio::test]
    async fn a_stream_whose_task_finished_ends_with_its_last_item() {
        assert_eq!(collected(false).await, vec![Ok(1), Ok(2)]);
    }

    #[tokio::test]
    async fn a_stream_whose_task_panicked_ends_with_an_error() {
        assert_eq!(
            collected(true).await,
            vec![Ok(1), Ok(2), Err("interrupted".to_owned())]
        );
    }
}
