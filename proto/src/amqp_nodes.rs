//! The nodes of one RabbitMQ broker a service connects to, tried in order
//! and round robin ([`AmqpNodes`]): a client of a cluster connects to any of
//! its nodes and, when that connection is lost, reconnects to another
//! (RabbitMQ docs, "Clustering Guide", "Clustering and Clients":
//! <https://www.rabbitmq.com/docs/clustering#clustering-and-clients>).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

/// The node URLs of one broker (a single node, or several nodes of one
/// cluster, one virtual host), and which one the next connection tries.
///
/// Every connection attempt takes [`AmqpNodes::next`]: the node after the
/// one the previous attempt took, whether that attempt failed or its
/// connection was later lost; so a dead node is skipped at once, and a
/// reconnect after a loss goes to another node. A clone has a cursor of its
/// own (starting where the original's is), so that each consumer or
/// publishing loop goes round on its own.
#[derive(Debug)]
pub struct AmqpNodes {
    urls: Arc<[String]>,
    next: AtomicUsize,
}

impl Clone for AmqpNodes {
    fn clone(&self) -> Self {
        Self {
            urls: Arc::clone(&self.urls),
            next: AtomicUsize::new(self.next.load(Ordering::Relaxed)),
        }
    }
}

/// One node of [`AmqpNodes`], as one connection attempt takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpNode {
    /// Its place in the list, from 0.
    pub index: usize,
    /// How many nodes the list has.
    pub count: usize,
    /// Its AMQP URL (with credentials: never log it, log
    /// [`AmqpNode::address`]).
    pub url: String,
}

impl AmqpNode {
    /// `host:port` of the node, without credentials or virtual host, for
    /// logs (the port the scheme's default when the URL names none);
    /// `(a URL that does not parse)` when it does not.
    pub fn address(&self) -> String {
        node_address(&self.url)
    }
}

impl std::fmt::Display for AmqpNode {
    /// `host:port (node 2 of 3)`, without credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (node {} of {})",
            self.address(),
            self.index + 1,
            self.count
        )
    }
}

impl AmqpNodes {
    /// The nodes `urls`, in the order to try them, the first one first.
    /// An empty list stands for one empty URL (whose connection fails with
    /// the parser's error; settings refuse it before).
    pub fn new(urls: Vec<String>) -> Self {
        let urls = if urls.is_empty() {
            vec![String::new()]
        } else {
            urls
        };
        Self {
            urls: urls.into(),
            next: AtomicUsize::new(0),
        }
    }

    /// One node (tests, and services given a single URL).
    pub fn single(url: impl Into<String>) -> Self {
        Self::new(vec![url.into()])
    }

    /// How many nodes; at least 1.
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Always false: there is at least one node.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The node URLs, in the order given.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The node the next connection attempt takes; the one after it is
    /// next from now on (round robin).
    pub fn next(&self) -> AmqpNode {
        let count = self.urls.len();
        let index = self.next.fetch_add(1, Ordering::Relaxed) % count;
        AmqpNode {
            index,
            count,
            url: self.urls[index].clone(),
        }
    }

    /// The node [`AmqpNodes::next`] took last (the first one before any):
    /// where a connection beside the current one goes.
    pub fn current(&self) -> AmqpNode {
        let count = self.urls.len();
        // The node of the latest `next`; the first before any attempt.
        let taken = self.next.load(Ordering::Relaxed);
        let index = taken.checked_sub(1).map_or(0, |last| last % count);
        AmqpNode {
            index,
            count,
            url: self.urls[index].clone(),
        }
    }
}

/// What to say of an AMQP connection or channel that the broker refused,
/// from the client's error text `error`, when the refusal will not mend by
/// itself as an outage does (AMQP 0-9-1 §1.7.2.1 reply codes, RabbitMQ's
/// texts): a refused login (`403 ACCESS_REFUSED - Login was refused`: a
/// wrong user or password), a virtual host that does not exist or that the
/// user may not use (`530 NOT_ALLOWED - vhost … not found`, `access to
/// vhost … refused`), or another operation the user may not do (`403
/// ACCESS_REFUSED - access to queue …`: a permission); `None` otherwise.
pub fn refusal_advice(error: &str) -> Option<&'static str> {
    if error.contains("Login was refused") {
        Some("the broker refused the login: check the user and password of --amqp-url")
    } else if error.contains("NOT_ALLOWED") && error.contains("vhost") {
        Some(
            "the broker refused the virtual host: check that the vhost of --amqp-url exists \
             and that the user may use it (rabbitmqctl list_vhosts, rabbitmqctl list_permissions -p VHOST)",
        )
    } else if error.contains("ACCESS_REFUSED") || error.contains("ACCESS-REFUSED") {
        Some(
            "the broker refused the user an operation: check its permissions \
             (rabbitmqctl list_user_permissions USER)",
        )
    } else {
        None
    }
}

/// `host:port` of an AMQP URL, without credentials (see
/// [`AmqpNode::address`]).
pub fn node_address(url: &str) -> String {
    match url.parse::<lapin::uri::AMQPUri>() {
        Ok(uri) => format!("{}:{}", uri.authority.host, uri.authority.port),
        // Never the URL: its password could be anywhere in it.
        Err(_) => "(a URL that does not parse)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_taken_round_robin_and_clones_go_round_on_their_own() {
        let nodes = AmqpNodes::new(vec![
            "amqp://u:secret@a:5672/%2f".to_owned(),
            "amqps://u:secret@b/%2f".to_owned(),
        ]);
        assert_eq!(nodes.current().index, 0, "the first before any attempt");
        assert_eq!(nodes.next().index, 0);
        assert_eq!(nodes.current().index, 0);
        let clone = nodes.clone();
        assert_eq!(nodes.next().index, 1);
        assert_eq!(nodes.next().index, 0);
        assert_eq!(clone.next().index, 1, "the clone's own cursor");
        let node = nodes.next();
        assert_eq!(node.address(), "b:5671", "the scheme's default port");
        assert_eq!(node.to_string(), "b:5671 (node 2 of 2)");
        assert!(!format!("{node}").contains("secret"));
    }

    #[test]
    fn an_empty_list_is_one_node() {
        let nodes = AmqpNodes::new(Vec::new());
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes.next().url, "");
    }
}
