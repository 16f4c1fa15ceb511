// Stands in for Gloo's header of this name (README.md beside gloo/): nothing of it is used.
#pragma once
