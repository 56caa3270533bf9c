//! One element of the JSON form of `k8s.v1.cni.cncf.io/networks`, read as Multus reads it:
//! Go's `json.Unmarshal` into a `NetworkSelectionElement` (k8snetworkplumbingwg/multus-cni
//! `pkg/types/types.go`), each field of its type, with the key rules of [`super::super::go_json`].
//! A value of the wrong type in any field, read or not, fails the whole annotation there, and
//! Multus never starts the pod.

use std::borrow::Cow;
use std::ops::Range;

use crate::go_json::{GoJson, Kind, Member, Reader};

/// What Multus reads of one element: each field's last value (Go's rule for keys that name
/// one field twice), and where each member is, to write the element back.
#[derive(Debug, Default)]
pub(crate) struct Selection<'a> {
    pub(crate) name: Cow<'a, str>,
    pub(crate) namespace: Cow<'a, str>,
    pub(crate) interface: Cow<'a, str>,
    /// `interfaceRequest`, the name before Multus 3.2
    pub(crate) deprecated_interface: Cow<'a, str>,
    /// The backing array of Go's `ips` slice: every item an `ips` list put there, which a
    /// `null` item of a later `ips` list at the same index keeps (see [`string_list`]).
    ips_written: Vec<Cow<'a, str>>,
    /// How many of `ips_written` the last `ips` list holds.
    ips_count: usize,
    pub(crate) mac: Cow<'a, str>,
    pub(crate) infiniband_guid: Cow<'a, str>,
    /// `default-route`'s IPs (each `net.IP`'s text: empty, or what `net.ParseIP` takes)
    pub(crate) default_route: Vec<Cow<'a, str>>,
    /// Each member's text, from its key to the end of its value.
    pub(crate) members: Vec<Range<usize>>,
    /// Which of `members` name `ips`.
    pub(crate) ips_members: Vec<usize>,
    /// The element's object.
    pub(crate) span: Range<usize>,
}

/// The fields of `NetworkSelectionElement`, by JSON name, and the Go type each is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Name,
    Namespace,
    Ips,
    Mac,
    InfinibandGuid,
    Interface,
    DeprecatedInterface,
    /// `[]*PortMapEntry`
    PortMappings,
    /// `*BandwidthEntry`
    Bandwidth,
    /// `string`, not read
    DeviceId,
    /// `*map[string]interface{}`
    CniArgs,
    /// `*[]net.IP`
    DefaultRoute,
}

const FIELDS: [(&str, Field); 12] = [
    ("name", Field::Name),
    ("namespace", Field::Namespace),
    ("ips", Field::Ips),
    ("mac", Field::Mac),
    ("infiniband-guid", Field::InfinibandGuid),
    ("interface", Field::Interface),
    ("interfaceRequest", Field::DeprecatedInterface),
    ("portMappings", Field::PortMappings),
    ("bandwidth", Field::Bandwidth),
    ("deviceID", Field::DeviceId),
    ("cni-args", Field::CniArgs),
    ("default-route", Field::DefaultRoute),
];

/// `PortMapEntry`'s fields: `hostPort` and `containerPort` are `int`, the others `string`.
const PORT_MAP_FIELDS: [(&str, bool); 4] = [
    ("hostPort", true),
    ("containerPort", true),
    ("protocol", false),
    ("hostIP", false),
];

/// `BandwidthEntry`'s fields, all `int`.
const BANDWIDTH_FIELDS: [&str; 4] = ["ingressRate", "ingressBurst", "egressRate", "egressBurst"];

impl<'a> Selection<'a> {
    /// `ips`, as strings (a `null` item is what Go left in its slice at that index).
    pub(crate) fn ips(&self) -> &[Cow<'a, str>] {
        &self.ips_written[..self.ips_count]
    }
}

/// Read the element object at the cursor.
pub(crate) fn read<'a>(reader: &mut Reader<'a>) -> GoJson<Selection<'a>> {
    let mut selection = Selection::default();
    let span = reader.object(|reader, member| {
        let field = FIELDS
            .iter()
            .find(|(name, _)| member.names(name))
            .map(|(name, field)| (*name, *field));
        let start = member.start;
        match field {
            Some((name, field)) => read_field(reader, &mut selection, name, field, &member)?,
            None => reader.skip(false)?,
        }
        selection.members.push(start..reader.position());
        Ok(())
    })?;
    selection.span = span;
    Ok(selection)
}

fn read_field<'a>(
    reader: &mut Reader<'a>,
    selection: &mut Selection<'a>,
    name: &str,
    field: Field,
    member: &Member<'a>,
) -> GoJson<()> {
    let slot = match field {
        Field::Name => &mut selection.name,
        Field::Namespace => &mut selection.namespace,
        Field::Mac => &mut selection.mac,
        Field::InfinibandGuid => &mut selection.infiniband_guid,
        Field::Interface => &mut selection.interface,
        Field::DeprecatedInterface => &mut selection.deprecated_interface,
        Field::DeviceId => {
            reader.string_field(name)?;
            return Ok(());
        }
        Field::Ips => {
            selection.ips_count =
                string_list(reader, name, &mut selection.ips_written, |_, _| Ok(()))?;
            selection.ips_members.push(selection.members.len());
            return Ok(());
        }
        Field::DefaultRoute => {
            // a `null` item sets a `net.IP` (a byte slice) to nil, whatever was there: no
            // backing array to keep
            let mut ips = Vec::new();
            string_list(reader, name, &mut ips, |reader, ip| {
                match ip.is_empty() || crate::annotations::go_parse_ip(ip).is_some() {
                    true => Ok(()),
                    false => reader.error(format!("{name:?}: {ip:?} is not an IP address")),
                }
            })?;
            selection.default_route = ips;
            return Ok(());
        }
        Field::PortMappings => return port_mappings(reader, name),
        Field::Bandwidth => return struct_of_ints(reader, name, &BANDWIDTH_FIELDS),
        Field::CniArgs => return map_of_anything(reader, name),
    };
    if let Some(value) = reader.string_field(&member.key)? {
        *slot = value;
    }
    Ok(())
}

/// Read a `[]string` (or `*[]net.IP`) into the slice whose backing array is `written`, as Go
/// decodes a list into a slice it already holds (`decodeState.array` in `encoding/json/decode.go`):
/// item `i` is decoded in place at index `i`, so a `null` item keeps the string an earlier list
/// of the same field left there (empty past them); `null` or `[]` leaves a new, empty slice.
/// Each item passes `check`. Gives the list's length; `written` holds at least that many (a
/// fresh `written` exactly that many).
fn string_list<'a>(
    reader: &mut Reader<'a>,
    name: &str,
    written: &mut Vec<Cow<'a, str>>,
    check: impl Fn(&Reader<'a>, &str) -> GoJson<()>,
) -> GoJson<usize> {
    let mut count = 0;
    match reader.peek()? {
        Kind::Null => {
            reader.null()?;
        }
        Kind::Array => reader.array(|reader| {
            let item = reader.string_field(name)?;
            if count == written.len() {
                written.push(Cow::Borrowed(""));
            }
            if let Some(item) = item {
                written[count] = item;
            }
            check(reader, &written[count])?;
            count += 1;
            Ok(())
        })?,
        other => return reader.error(format!("{name:?} is {}, not a list", other.name())),
    }
    if count == 0 {
        written.clear();
    }
    Ok(count)
}

/// `portMappings`: `null`, or a list of `null`s and objects of [`PORT_MAP_FIELDS`].
fn port_mappings(reader: &mut Reader<'_>, name: &str) -> GoJson<()> {
    match reader.peek()? {
        Kind::Null => reader.null().map(drop),
        Kind::Array => reader.array(|reader| {
            if reader.null()? {
                return Ok(());
            }
            expect_object(reader, name)?;
            reader.object(|reader, member| {
                match PORT_MAP_FIELDS.iter().find(|(f, _)| member.names(f)) {
                    Some((field, true)) => reader.int_field(field),
                    Some((field, false)) => reader.string_field(field).map(drop),
                    None => reader.skip(false),
                }
            })?;
            Ok(())
        }),
        other => reader.error(format!("{name:?} is {}, not a list", other.name())),
    }
}

/// `bandwidth`: `null`, or an object whose fields `fields` are integers.
fn struct_of_ints(reader: &mut Reader<'_>, name: &str, fields: &[&str]) -> GoJson<()> {
    if reader.null()? {
        return Ok(());
    }
    expect_object(reader, name)?;
    reader.object(
        |reader, member| match fields.iter().find(|f| member.names(f)) {
            Some(field) => reader.int_field(field),
            None => reader.skip(false),
        },
    )?;
    Ok(())
}

/// `cni-args`: `null`, or an object of any values (numbers within a float64).
fn map_of_anything(reader: &mut Reader<'_>, name: &str) -> GoJson<()> {
    if reader.null()? {
        return Ok(());
    }
    expect_object(reader, name)?;
    reader.skip(true)
}

fn expect_object(reader: &mut Reader<'_>, name: &str) -> GoJson<()> {
    match reader.peek()? {
        Kind::Object => Ok(()),
        other => reader.error(format!("{name:?} holds {}, not an object", other.name())),
    }
}
