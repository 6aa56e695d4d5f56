#pragma once
// Who is writing a row that is still in progress (a reply as it streams, a training run): this
// process's identity, stored with such rows, and whether the process an identity names still
// runs. Database::open turns rows whose writer has gone (a crash, a kill) into interrupted ones
// (core/storage/recovery.h), and leaves alone those of a live process — the desktop app and the
// CLI share one database.
//
// An identity is "<boot id> <pid> <start time>" (Linux: /proc/sys/kernel/random/boot_id and field
// 22 of /proc/<pid>/stat, in clock ticks after boot), so a pid reused by a later process, or after
// a reboot, is not mistaken for the writer.

#include <string>
#include <string_view>

namespace tokenfab {

// This process's identity (computed again after a fork).
std::string this_writer();

// False when the process `writer` names has exited (or is a zombie), or the machine has booted
// since; true while it runs. An identity that cannot be parsed counts as gone.
bool writer_is_alive(std::string_view writer);

}  // namespace tokenfab
