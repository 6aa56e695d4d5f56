#pragma once
// The folders the user added to the model library (`tokenfab-cli models --add-folder DIR`): a
// small JSON file in the user data home, written atomically.

#include <filesystem>
#include <vector>

namespace tokenfab {

// The user's model folders: user data home (TOKENFAB_HOME, else $XDG_DATA_HOME/tokenfab, else
// ~/.local/share/tokenfab) / model_folders.json, {"folders": ["/abs/dir", …]}.
std::filesystem::path model_folders_file();
// The folders listed; none when the file is absent. Throws Error for a file that is not that JSON.
std::vector<std::filesystem::path> user_model_folders();
// Adds `folder` (made absolute; must be an existing directory) unless listed; false when it was.
// The file is written atomically. Throws Error naming the folder or the file.
bool add_model_folder(const std::filesystem::path& folder);
// Removes `folder` from the list; false when it was not listed.
bool remove_model_folder(const std::filesystem::path& folder);

}  // namespace tokenfab
