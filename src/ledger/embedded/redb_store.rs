//! The redb store: one redb file (`ledger.redb`, a copy-on-write B-tree), what ip-webhook used
//! before the journal. Kept for the benchmarks' comparison and to migrate old state dirs.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use redb::{ConcurrencyMode, Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::{Records, Reply, Request, apply, storage};
use crate::ledger::{Claim, LedgerError};

const CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("claims");

pub(super) fn open_redb(path: &Path) -> Result<Database, LedgerError> {
    // SingleWriter: one writing process, and `status`, `explain` and `review --dry-run` may
    // read the file meanwhile ([`read_claims`]); a second writer is still refused.
    let db = Database::builder()
        .set_concurrency_mode(ConcurrencyMode::SingleWriter)
        .create(path)
        .map_err(|e| {
            LedgerError::Storage(format!(
                "cannot open {} (is another ip-webhook using this --state-dir?): {e}",
                path.display()
            ))
        })?;
    let txn = db.begin_write().map_err(storage("begin"))?;
    txn.open_table(CLAIMS).map_err(storage("open table"))?;
    txn.commit().map_err(storage("commit"))?;
    Ok(db)
}

/// Every claim in the file.
pub(super) fn load(db: &Database) -> Result<Vec<Claim>, LedgerError> {
    let txn = db.begin_read().map_err(storage("begin read"))?;
    let table = txn.open_table(CLAIMS).map_err(storage("open table"))?;
    let mut claims = Vec::new();
    for entry in table.iter().map_err(storage("iterate"))? {
        let (key, value) = entry.map_err(storage("read"))?;
        claims.push(decode(key.value(), value.value())?);
    }
    Ok(claims)
}

struct RedbRecords<'a, 'txn>(&'a mut redb::Table<'txn, &'static str, &'static [u8]>);

impl Records for RedbRecords<'_, '_> {
    fn read(&mut self, ip: IpAddr) -> Result<Option<Arc<Claim>>, LedgerError> {
        let key = ip.to_string();
        match self.0.get(key.as_str()).map_err(storage("read"))? {
            Some(bytes) => decode(&key, bytes.value()).map(|claim| Some(Arc::new(claim))),
            None => Ok(None),
        }
    }

    fn write(&mut self, claim: Arc<Claim>) -> Result<(), LedgerError> {
        let key = claim.ip.to_string();
        let bytes = serde_json::to_vec(&*claim).map_err(storage("encode"))?;
        self.0
            .insert(key.as_str(), bytes.as_slice())
            .map_err(storage("write"))?;
        Ok(())
    }
}

pub(super) fn commit(
    db: &Database,
    batch: &mut Vec<Request>,
    replies: &mut Vec<Reply>,
) -> Result<u64, LedgerError> {
    let txn = db.begin_write().map_err(storage("begin"))?;
    let writes = {
        let mut table = txn.open_table(CLAIMS).map_err(storage("open table"))?;
        apply(&mut RedbRecords(&mut table), batch, replies)?
    };
    if writes == 0 {
        // nothing changed: no fsync for a batch of refusals
        txn.abort().map_err(storage("abort"))?;
    } else {
        txn.commit().map_err(storage("commit"))?;
    }
    Ok(writes)
}

/// Every claim in `state_dir/ledger.redb`, read without creating or changing anything, also
/// while a server has the file open (it writes in SingleWriter mode, which admits readers).
pub(super) fn read(state_dir: &Path) -> Result<Vec<Claim>, LedgerError> {
    let path = state_dir.join("ledger.redb");
    let db = redb::Builder::new()
        .set_concurrency_mode(ConcurrencyMode::SingleWriter)
        .open_read_only(&path)
        .map_err(|e| {
            let what = match e {
                redb::DatabaseError::DatabaseAlreadyOpen => format!(
                    "{} is held by a process that does not share it (an older ip-webhook?); stop it and retry",
                    path.display()
                ),
                redb::DatabaseError::RepairAborted => format!(
                    "{} was not closed cleanly and needs a repair, which only a writer makes: start `ip-webhook serve --state-dir {}` once",
                    path.display(),
                    state_dir.display()
                ),
                other => format!("cannot read {}: {other}", path.display()),
            };
            LedgerError::Storage(what)
        })?;
    let txn = db.begin_read().map_err(storage("begin read"))?;
    let table = match txn.open_table(CLAIMS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(storage("open table")(e)),
    };
    let mut claims = Vec::new();
    for entry in table.iter().map_err(storage("iterate"))? {
        let (key, value) = entry.map_err(storage("read"))?;
        claims.push(decode(key.value(), value.value())?);
    }
    Ok(claims)
}

fn decode(key: &str, bytes: &[u8]) -> Result<Claim, LedgerError> {
    serde_json::from_slice(bytes).map_err(|e| LedgerError::Corrupt {
        ip: key.to_string(),
        reason: e.to_string(),
    })
}
