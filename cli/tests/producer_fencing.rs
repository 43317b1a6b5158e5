//! `pico_client::Producer` against a real `pico serve`: a newer epoch fences an older session
//! of the same producer id (403 poisons it), and a closed or missing stream fails the session
//! with the server's error.

mod common;

use std::time::Duration;

use common::Server;
use pico_client::{Client, ClientConfig, ErrorKind, Producer, ProducerConfig};

fn client(server: &Server) -> Client {
    let mut config = ClientConfig::new(format!("http://{}", server.addr));
    config.request_timeout = Duration::from_secs(15);
    Client::new(config).unwrap()
}

fn session(client: &Client, stream: &str, id: &str, epoch: u64) -> Producer {
    let config = ProducerConfig {
        epoch,
        ..ProducerConfig::with_id(id)
    };
    Producer::new(client.clone(), stream, config).unwrap()
}

async fn bodies(client: &Client, stream: &str) -> Vec<String> {
    let page = client.read(stream, 0).await.unwrap();
    assert!(page.up_to_date);
    page.records
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_newer_epoch_fences_the_older_session() {
    let server = Server::start(&["--cores", "1"]);
    let client = client(&server);
    client.create("/fence", None, None).await.unwrap();

    let old = session(&client, "/fence", "writer", 0);
    assert_eq!(old.send("a0").await.unwrap().await.unwrap(), 0);
    let new = session(&client, "/fence", "writer", 1);
    assert_eq!(new.send("b0").await.unwrap().await.unwrap(), 1);

    let err = old.send("a1").await.unwrap().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleEpoch, "{err}");
    assert_eq!(err.code(), Some("fenced"));
    assert_eq!(
        old.send("a2").await.unwrap_err().kind(),
        ErrorKind::StaleEpoch
    );
    assert_eq!(old.close().await.unwrap_err().kind(), ErrorKind::StaleEpoch);

    assert_eq!(new.send("b1").await.unwrap().await.unwrap(), 2);
    new.close().await.unwrap();
    assert_eq!(bodies(&client, "/fence").await, ["a0", "b0", "b1"]);
}

#[tokio::test(flavor = "current_thread")]
async fn closed_and_missing_streams_fail_the_session() {
    let server = Server::start(&["--cores", "1"]);
    let client = client(&server);
    client.create("/closing", None, None).await.unwrap();
    let producer = session(&client, "/closing", "w", 0);
    producer.send("x").await.unwrap();
    producer.flush().await.unwrap();
    assert_eq!(client.close("/closing").await.unwrap(), 1);
    let err = producer.send("y").await.unwrap().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert_eq!(
        producer.flush().await.unwrap_err().kind(),
        ErrorKind::Closed
    );
    assert_eq!(bodies(&client, "/closing").await, ["x"]);

    let producer = session(&client, "/missing", "w", 0);
    let err = producer.send("z").await.unwrap().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}
