//! Garbage collection of segment objects, run by core 0 for the node: segments that hold
//! only deleted, expired or trimmed-away data are deleted from the object store, then from
//! the catalog (in that order, so a crash in between leaves a row to find again, never an
//! object nobody knows of).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::now_ms;
use crate::inbox::Message;
use crate::limits;
use crate::route::Router;

/// Collects every `gc_interval_ms`, for the life of the core.
pub(crate) async fn gc_loop(router: Rc<Router>) {
    // At least `limits::GC_INTERVAL_MS_MIN`: `EngineConfig::check` refused a shorter one.
    let interval = Duration::from_millis(router.shard.config().gc_interval_ms);
    loop {
        glommio::timer::sleep(interval).await;
        match collect_garbage(&router).await {
            Ok(0) => {}
            Ok(count) => log::info!("garbage collection removed {count} segments"),
            Err(e) => log::warn!("garbage collection: {e}"),
        }
    }
}

async fn collect_garbage(router: &Router) -> Result<usize, String> {
    // Which streams need a segment is the catalog's to say (a trim reaches it right after the
    // owning core): the cores no longer list every stream they hold for each round, work and
    // memory that grew with the streams, not with the garbage.
    let sealed_before_ms = now_ms() - limits::GC_SEALED_MARGIN_MS;
    let (meta, store) = (router.shard.meta(), router.shard.store());
    let keys = meta
        .garbage_segments(sealed_before_ms)
        .await
        .map_err(|_| "metadata store stopped".to_string())?
        .map_err(|e| e.to_string())?;
    if keys.is_empty() {
        return Ok(0);
    }
    for key in &keys {
        match store.delete(key).await {
            Ok(Ok(())) | Ok(Err(pico_s3::StoreError::NotFound(_))) => {}
            Ok(Err(e)) => return Err(format!("deleting {key}: {e}")),
            Err(_) => return Err("object store stopped".into()),
        }
    }
    meta.drop_segments(keys.clone())
        .await
        .map_err(|_| "metadata store stopped".to_string())?
        .map_err(|e| e.to_string())?;
    router.shard.count_collected(keys.len());
    let keys = Arc::new(keys);
    router.shard.forget_segments(&keys);
    for core in router.others() {
        let _ = router
            .peers
            .send(core, Message::Forget { keys: keys.clone() });
    }
    Ok(keys.len())
}
